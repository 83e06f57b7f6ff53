"""The kept engine goes back from head to base, and plans one state twice, as a fresh engine would.

A PR plan (`prplan.compose` with one `replanning.WarmPlanner`) plans head
(read by delta from base), then base, then asks for base's engine, then
head's with head's plan applied. Only head was read by delta: going back to
base uses its keys the other way ("reverse"), and asking again for the very
state the engine was brought to looks at no document ("same") when that
state is immutable by contract (it was read by delta, or a Delta is based on
it). Each of these must leave the engine holding what
`placing.Engine(state, observed)` holds; a state that may have been edited
in place is compared in full.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest

from desired import models as m
from desired.state import Delta, DesiredState
from reconciler import plans
from reconciler.placement import capacity, placing, prplan, replanning
from reconciler.placement.replanning import WarmPlanner
from schemas import states
from tests.claims.test_inventory_incremental import _delta
from tests.placement.test_warm_planner import POLICIES, _cold, _edit_allocations, _edit_nodes, _fleet


def _view(engine: placing.Engine, desired: DesiredState, observed: plans.Observed) -> dict[str, Any]:
    """What readers of an engine see, and the per-node state planning starts from."""
    nodes = {
        n.name: (n.facts, dict(n.allocs), dict(n.since), dict(n.ends), n.exclusive, n.claimed)
        for n in engine.state.nodes
    }
    return {
        "nodes": nodes,
        "where": {aid: node.name for aid, node in engine.where.items()},
        "modes": {n.name: engine.mode(n.name) for n in engine.nodes},
        "empty": engine.empty_nodes,
        "read_model": capacity.read_model(desired, observed, engine=engine),
    }


def _same_as_cold(engine: placing.Engine, desired: DesiredState, observed: plans.Observed, policy: str) -> None:
    assert _view(engine, desired, observed) == _view(
        placing.Engine(desired, observed, policy=policy), desired, observed
    )


def _head(rng: random.Random, base: DesiredState, edits: int) -> tuple[DesiredState, Delta]:
    """Base with a few allocations and nodes edited, and the Delta a read of it by delta from base gives.

    The node set stays: a node added or removed builds the engine cold (test_warm_planner).
    """
    new = copy.copy(base)
    step = 0
    while step < edits:
        edited = copy.copy(new)
        if rng.random() < 0.5:
            _edit_allocations(rng, edited, step)
        else:
            _edit_nodes(rng, edited, step)
        if edited.nodes.keys() == base.nodes.keys():
            new, step = edited, step + 1
    return new, _delta(base, new)


def _claims(plan: plans.Plan) -> plans.Observed:
    """What base implies on its own (prplan's offline claims), with a slot or two in cleanup."""
    observed = prplan.after(plans.Observed(), plan)
    statuses = {(p.node, p.slot_indexes[0]): states.SlotStatus.CLEANUP for p in plan.placements[:2] if p.slot_indexes}
    return dataclasses.replace(observed, slot_status=statuses)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_pr_plans_sequence_leaves_each_engine_as_a_cold_one(policy: str, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test randomness
    base = _fleet(nodes=12, baremetal_nodes=2, allocations=40, baremetal_allocations=2, gpus=(1, 2, 4, 8), seed=seed)
    warm = WarmPlanner(policy)
    observed = _claims(warm(base, plans.Observed()))
    for _ in range(3):  # one base, several PRs: each head is read by delta from base
        head, delta = _head(rng, base, rng.choice((1, 3, 6)))
        head_plan = warm(head, observed, delta)
        assert (warm.last_sync, head_plan) == ("delta", _cold(head, observed, policy))
        base_plan = warm(base, observed)
        assert (warm.last_sync, base_plan) == ("reverse", _cold(base, observed, policy))
        _same_as_cold(warm.engine(base, observed), base, observed, policy)
        assert warm.last_sync == "same"
        observed_after = prplan.after(observed, head_plan)
        _same_as_cold(warm.engine(head, observed_after, delta), head, observed_after, policy)
        assert warm.last_sync == "delta"
        _same_as_cold(warm.engine(head, observed, delta), head, observed, policy)  # head again: frozen, claims differ
        assert warm.last_sync == "same"
        _same_as_cold(warm.engine(base, observed_after), base, observed_after, policy)
        assert warm.last_sync == "reverse"
    assert warm.cold == 1


def test_the_same_frozen_state_follows_changed_observed_facts() -> None:
    """No document changed, but slot statuses, health and firmware did: those nodes get new facts."""
    base = _fleet(nodes=6, allocations=12, gpus=(1, 2, 4), seed=11)
    head, delta = _head(random.Random(11), base, 2)  # noqa: S311 - test randomness
    warm = WarmPlanner()
    observed = _claims(warm(base, plans.Observed()))
    warm(head, observed, delta)
    warm(base, observed)
    n0, n1, n2 = sorted(base.nodes)[:3]
    changed = dataclasses.replace(
        observed,
        slot_status={**observed.slot_status, (n0, 3): states.SlotStatus.FAILED},
        unavailable_nodes=frozenset({n1}),
        firmware_ready={n2: False},
    )
    got = warm(base, changed)
    assert warm.last_sync == "same" and warm.last_reset >= 3
    assert got == _cold(base, changed, "default")
    _same_as_cold(warm.engine(base, changed), base, changed, "default")


def test_a_state_edited_in_place_is_compared_in_full() -> None:
    """A state with no Delta, that nothing was read by delta from, may change under the same object."""
    state = _fleet(nodes=6, allocations=12, gpus=(1, 2, 4), seed=12)
    warm = WarmPlanner()
    warm(state, plans.Observed())
    name = sorted(state.nodes)[0]
    state.nodes[name] = state.nodes[name].model_copy(update={"admin_state": m.AdminState.DRAINING})
    got = warm(state, plans.Observed())
    assert warm.last_sync == "full"
    assert got == _cold(state, plans.Observed(), "default")
    _same_as_cold(warm.engine(state, plans.Observed()), state, plans.Observed(), "default")
    assert warm.last_sync == "full" and warm.cold == 1


def test_a_base_with_no_live_child_is_not_trusted() -> None:
    """Base is frozen only while the engine came back to it from its child: a fresh run trusts nothing."""
    base = _fleet(nodes=4, allocations=6, gpus=(1, 2), seed=13)
    warm = WarmPlanner()
    warm(base, plans.Observed())
    warm(base, plans.Observed())
    assert warm.last_sync == "full"  # planned twice with no Delta either side: compared in full
    head, delta = _head(random.Random(13), base, 1)  # noqa: S311 - test randomness
    warm(head, plans.Observed(), delta)
    warm(base, plans.Observed())
    warm(base, plans.Observed())
    assert warm.last_sync == "same"


def test_a_pr_plan_with_the_warm_planner_equals_one_composed_cold() -> None:
    base = _fleet(nodes=10, baremetal_nodes=2, allocations=30, baremetal_allocations=2, gpus=(1, 2, 4, 8), seed=14)
    head, delta = _head(random.Random(14), base, 4)  # noqa: S311 - test randomness
    cold = prplan.compose(base, head, prplan.offline_observed(base), offline=True)
    warm = replanning.WarmPlanner()
    observed = prplan.offline_observed(base, plan_with=warm)
    got = prplan.compose(base, head, observed, offline=True, plan_with=warm, engine_for=warm.engine, delta=delta)
    assert got == cold
    assert warm.cold == 1 and warm.by_delta == 4  # head, back to base, base again, head after
