"""The planner's memos (node facts, slot eligibility) never change a plan (issue 10).

The watch loop hands the planner the same document objects for unchanged
files; facts computed for them are reused. Over random sequences of edits to
desired state (drains, slot maps, new allocations) and to observed state
(slot statuses, health, firmware), the plan with warm memos equals the plan
computed cold.
"""

from __future__ import annotations

import copy
import random

import pytest

from desired import models as m
from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from policies import eligibility
from reconciler import plans
from reconciler.placement import fleetgraph, planner, reserving
from schemas import states


def _cold(desired: DesiredState, observed: plans.Observed) -> plans.Plan:
    fleetgraph._FACTS = {}
    eligibility._MEMO.clear()
    return planner.plan(desired, observed)


def _edit(rng: random.Random, state: DesiredState) -> DesiredState:
    new = copy.copy(state)
    new.nodes, new.slot_maps = dict(state.nodes), dict(state.slot_maps)
    name = rng.choice(sorted(new.nodes))
    if rng.random() < 0.5:
        node = new.nodes[name]
        flip = m.AdminState.DRAINING if node.admin_state is m.AdminState.ACTIVE else m.AdminState.ACTIVE
        new.nodes[name] = node.model_copy(update={"admin_state": flip})
    elif name in new.slot_maps:
        smap = new.slot_maps[name]
        i = rng.randrange(len(smap.slots))
        slots = list(smap.slots)
        slots[i] = slots[i].model_copy(update={"enabled": not slots[i].enabled})
        new.slot_maps[name] = smap.model_copy(update={"slots": tuple(slots)})
    return new


def _observe(rng: random.Random, state: DesiredState) -> plans.Observed:
    statuses = {}
    for name, smap in state.slot_maps.items():
        for s in smap.slots:
            if rng.random() < 0.1:
                statuses[(name, s.slot_index)] = rng.choice([states.SlotStatus.CLEANUP, states.SlotStatus.FAILED])
    nodes = sorted(state.nodes)
    return plans.Observed(
        slot_status=statuses,
        firmware_ready={n: rng.random() < 0.9 for n in rng.sample(nodes, 2)},
        unavailable_nodes=frozenset(rng.sample(nodes, 1)),
    )


@pytest.mark.parametrize("reserve", [None, 2])  # fleet.placement.whole_host_reserve: absent, max_hosts 2
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_warm_plans_equal_cold_plans(seed: int, reserve: int | None) -> None:
    rng = random.Random(seed)  # noqa: S311 - test randomness
    state = synthetic.fleet(
        nodes=8, baremetal_nodes=2, allocations=30, baremetal_allocations=2, gpus=(1, 2, 4, 8), seed=seed
    )
    if reserve is not None:
        reserving.set_on_fleet(state, m.WholeHostReserve(max_hosts=reserve))
    observed = plans.Observed()
    for _ in range(25):
        if rng.random() < 0.6:
            state = _edit(rng, state)
        else:
            observed = _observe(rng, state)
        warm = planner.plan(state, observed)
        assert warm == _cold(state, observed)
        assert warm == planner.plan(state, observed)  # warm again, right after a cold run
