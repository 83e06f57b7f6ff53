"""The watch loop's kept placement engine plans exactly what a fresh one plans (issue 10).

`replanning.WarmPlanner` keeps the engine between revisions and resets only
the nodes whose facts or observed claims changed. Over random sequences of
edits - allocations added, changed, released and deleted, drains, slots
disabled, nodes dedicated, added and removed, the Fleet and SKUs changed,
slot statuses, health and image caches, claims written to "the database"
by another reconciler, plans applied in part or not at all - the warm plan
equals a cold `planner.plan` after every step, and the engine is rebuilt
cold only when the fleet's shape changed. With a Delta on each state (as
`desired.reading.deltas` gives the watch loop) only the named nodes and those whose
observed facts differ get new facts; the plans are the same.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import random
from typing import Any

import pytest

from desired import models as m
from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from policies import eligibility, packing
from reconciler import plans
from reconciler.placement import fleetgraph, placing, planner, reasons, replanning, reserving
from schemas import states
from tests.claims.test_inventory_incremental import _delta

POLICIES = [p.value for p in packing.ALL]
DIGESTS = ("a" * 64, "0" * 63 + "1")
Claims = dict[tuple[str, int | None], plans.ExistingClaim]  # (node, slot or None) -> claim: "the database"


def _fleet(**kw: Any) -> DesiredState:
    """A synthetic fleet whose slot disks carry a recorded identity (every slot eligible)."""
    state = synthetic.fleet(**kw)
    for name, smap in state.slot_maps.items():
        slots = tuple(
            s
            if s.nvme_identity is not None
            else s.model_copy(
                update={"nvme_identity": m.NvmeIdentity(serial=f"bench-{name}-{s.slot_index}", size_bytes=2**40)}
            )
            for s in smap.slots
        )
        state.slot_maps[name] = smap.model_copy(update={"slots": slots})
    return state


def _cold(desired: DesiredState, observed: plans.Observed, policy: str) -> plans.Plan:
    """A plan with every memo empty; the warm planner's facts memo is put back after."""
    kept = fleetgraph._FACTS
    fleetgraph._FACTS = {}
    eligibility._MEMO.clear()
    try:
        return planner.plan(desired, observed, policy=policy)
    finally:
        fleetgraph._FACTS = kept


def _observed(db: Claims, base: plans.Observed) -> plans.Observed:
    claims = tuple(db.values())
    return dataclasses.replace(base, claims=claims, placed=frozenset(c.allocation_id for c in claims))


def _claim(
    aid: str,
    node: str,
    slot: int | None,
    status: states.ClaimStatus = states.ClaimStatus.ACTIVE,
) -> plans.ExistingClaim:
    kind = states.ClaimKind.NODE_EXCLUSIVE if slot is None else states.ClaimKind.SLOT
    return plans.ExistingClaim(aid, node, kind, slot, status)


def _apply(rng: random.Random, plan: plans.Plan, db: Claims) -> None:
    """Apply the plan as the database would: some placements lost (a failed apply), releases freed."""
    for p in plan.placements:
        if rng.random() < 0.3:
            continue  # the apply failed: the next plan must not believe this placement
        keys: list[tuple[str, int | None]] = [(p.node, s) for s in p.slot_indexes] or [(p.node, None)]
        if any(k in db for k in keys) or (p.node, None) in db:
            continue  # lost a race to another reconciler
        for k in keys:
            db[k] = _claim(p.allocation_id, *k, states.ClaimStatus.RESERVED)
    for r in plan.releases:
        for k, c in list(db.items()):
            if c.allocation_id == r.allocation_id:
                if rng.random() < 0.5:
                    db[k] = dataclasses.replace(c, status=states.ClaimStatus.RELEASING)
                else:
                    del db[k]


def _other_reconciler(rng: random.Random, state: DesiredState, db: Claims) -> None:
    """Claims the warm planner did not make: taken, dropped or moved behind its back."""
    choice = rng.random()
    held = sorted({c.allocation_id for c in db.values()})
    if choice < 0.4:
        aid = rng.choice(sorted(state.allocations))
        node = rng.choice(sorted(state.slot_maps))
        for s in rng.sample(range(8), rng.choice((1, 2))):
            if (node, s) not in db and (node, None) not in db:
                db[(node, s)] = _claim(aid, node, s)
    elif choice < 0.7 and held:
        aid = rng.choice(held)
        for k in [k for k, c in db.items() if c.allocation_id == aid]:
            del db[k]
    elif held:
        aid = rng.choice(held)
        for k, c in list(db.items()):
            if c.allocation_id == aid:
                db[k] = dataclasses.replace(c, status=states.ClaimStatus.PROVISIONING)


def _edit_allocations(rng: random.Random, new: DesiredState, step: int) -> None:
    new.allocations = dict(new.allocations)
    aid = rng.choice(sorted(new.allocations))
    alloc = new.allocations[aid]
    roll = rng.random()
    if roll < 0.35:
        bare = rng.random() < 0.15
        new_id = f"new-{step:04d}"
        new.allocations[new_id] = alloc.model_copy(
            update={
                "id": new_id,
                "tenant": rng.choice(("tenant-1", "tenant-2")),
                "sku": synthetic.BAREMETAL_SKU if bare else synthetic.SLICE_SKU,
                "gpu_count": 8 if bare else rng.choice((1, 2, 4, 8)),
                "image": None if bare else synthetic.IMAGE,
                "requested_at": alloc.requested_at + dt.timedelta(seconds=rng.randrange(-50, 500)),
                "lease_hours": rng.choice((None, 1.0, 24.0)),
                "state": m.AllocationState.PRESENT,
            }
        )
    elif roll < 0.55:
        new.allocations[aid] = alloc.model_copy(
            update={
                "requested_at": alloc.requested_at + dt.timedelta(seconds=rng.randrange(-30, 30)),
                "lease_hours": rng.choice((None, 2.0, 48.0)),
            }
        )
    elif roll < 0.8:
        new.allocations[aid] = alloc.model_copy(update={"state": m.AllocationState.RELEASED})
    else:
        del new.allocations[aid]


def _edit_nodes(rng: random.Random, new: DesiredState, step: int) -> None:
    new.nodes, new.slot_maps = dict(new.nodes), dict(new.slot_maps)
    name = rng.choice(sorted(new.nodes))
    node = new.nodes[name]
    roll = rng.random()
    if roll < 0.3:
        flip = m.AdminState.DRAINING if node.admin_state is m.AdminState.ACTIVE else m.AdminState.ACTIVE
        new.nodes[name] = node.model_copy(update={"admin_state": flip})
    elif roll < 0.45:
        new.nodes[name] = node.model_copy(update={"org": rng.choice((None, "tenant-1", "tenant-2"))})
    elif roll < 0.75 and name in new.slot_maps:
        smap = new.slot_maps[name]
        slots = list(smap.slots)
        i = rng.randrange(len(slots))
        slots[i] = slots[i].model_copy(update={"enabled": not slots[i].enabled})
        new.slot_maps[name] = smap.model_copy(update={"slots": tuple(slots)})
    elif roll < 0.88:
        added = f"node-x{step:04d}"
        new.nodes[added] = node.model_copy(update={"name": added})
        if name in new.slot_maps:
            new.slot_maps[added] = new.slot_maps[name].model_copy(update={"node": added})
    elif len(new.nodes) > 4:
        del new.nodes[name]
        new.slot_maps.pop(name, None)


def _edit_shape(rng: random.Random, new: DesiredState) -> None:
    """The Fleet or a SKU: what every partition is built from."""
    if rng.random() < 0.5 and new.fleet is not None:
        weight = rng.choice((0.5, 1.0, 2.0))
        new.fleet = new.fleet.model_copy(
            update={"placement": new.fleet.placement.model_copy(update={"lease_end_weight": weight})}
        )
    else:
        new.skus = dict(new.skus)
        sku = new.skus[synthetic.SLICE_SKU]
        new.skus[synthetic.SLICE_SKU] = sku.model_copy(update={"gpu_hourly_price_minor": rng.randrange(100, 900)})


def _observe(rng: random.Random, state: DesiredState, base: plans.Observed) -> plans.Observed:
    nodes = sorted(state.nodes)
    roll = rng.random()
    if roll < 0.4:
        statuses = dict(base.slot_status)
        node = rng.choice(sorted(state.slot_maps))
        key = (node, rng.randrange(8))
        if key in statuses:
            del statuses[key]
        else:
            statuses[key] = rng.choice(
                (states.SlotStatus.CLEANUP, states.SlotStatus.FAILED, states.SlotStatus.DISABLED)
            )
        return dataclasses.replace(base, slot_status=statuses)
    if roll < 0.6:
        return dataclasses.replace(
            base,
            unavailable_nodes=frozenset(rng.sample(nodes, rng.choice((0, 1)))),
            firmware_ready={n: rng.random() < 0.8 for n in rng.sample(nodes, 2)},
        )
    cache = dict(base.image_cache)
    for n in rng.sample(nodes, 3):
        cache[n] = frozenset(d for d in DIGESTS if rng.random() < 0.5)
    return dataclasses.replace(base, image_cache=cache)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("seed", "by_delta"), [(1, False), (2, False), (3, True), (4, True)])
def test_warm_plans_equal_cold_plans_over_random_edits(policy: str, seed: int, by_delta: bool) -> None:
    _random_edits(policy, seed, by_delta)


@pytest.mark.parametrize(("seed", "by_delta"), [(1, False), (2, False), (4, True), (6, True)])
def test_warm_plans_equal_cold_plans_with_the_whole_host_reserve(seed: int, by_delta: bool) -> None:
    """`fleet.placement.whole_host_reserve` on: the held requests and their reasons are the same warm and cold."""
    held = _random_edits(packing.Policy.DEFAULT.value, seed, by_delta, m.WholeHostReserve(max_hosts=2))
    assert held > 0  # the reserve held requests back


def _random_edits(policy: str, seed: int, by_delta: bool, reserve: m.WholeHostReserve | None = None) -> int:
    """Sixty random steps, the warm plan checked against a cold one after each; the requests held for the
    reserve, summed over the plans."""
    rng = random.Random(seed)  # noqa: S311 - test randomness
    state = _fleet(nodes=10, baremetal_nodes=2, allocations=40, baremetal_allocations=2, gpus=(1, 2, 4, 8), seed=seed)
    if reserve is not None:
        reserving.set_on_fleet(state, reserve)
    db: Claims = {}
    base = plans.Observed()
    warm = replanning.WarmPlanner(policy)
    expected_cold = 1  # the first plan
    placed = released = held = 0
    for step in range(60):
        new = copy.copy(state)
        roll = rng.random()
        if roll < 0.35:
            _edit_allocations(rng, new, step)
        elif roll < 0.6:
            _edit_nodes(rng, new, step)
        elif roll < 0.65:
            _edit_shape(rng, new)
        elif roll < 0.85:
            base = _observe(rng, new, base)
        else:
            _other_reconciler(rng, new, db)
        # what shapes the whole index: only these rebuild cold
        expected_cold += new.fleet != state.fleet or new.skus != state.skus or new.nodes.keys() != state.nodes.keys()
        # the loop holds the state in force while it plans the next: a delta's base is alive
        before, state = state, new
        observed = _observed(db, base)
        got = warm(state, observed, _delta(before, state) if by_delta else None)
        assert got == _cold(state, observed, policy), (step, warm.last_cold)
        placed += len(got.placements)
        released += len(got.releases)
        held += sum(q.code == reasons.RESERVED for q in got.pending)
        _apply(rng, got, db)
        del before
    assert warm.cold == expected_cold, warm.last_cold  # every other plan came from the kept engine
    assert placed > 20 and released > 0  # the sequence exercised placing and releasing
    assert (warm.by_delta > 20) is by_delta
    return held


def test_a_placement_whose_apply_failed_is_not_believed() -> None:
    state = _fleet(nodes=2, allocations=2, gpus=(8,), seed=3)
    warm = replanning.WarmPlanner()
    first = warm(state, plans.Observed())
    assert len(first.placements) == 2  # one 8-GPU allocation per node
    # Nothing was applied; a third allocation arrives. The kept engine placed two
    # allocations last time, but the database holds no claim: the nodes are free.
    state.allocations = dict(state.allocations)
    aid = "late-one"
    state.allocations[aid] = state.allocations[synthetic.allocation_id(0)].model_copy(update={"id": aid})
    second = warm(state, plans.Observed())
    assert {p.allocation_id for p in second.placements} == {
        synthetic.allocation_id(0),
        synthetic.allocation_id(1),
        aid,
    } - {p.allocation_id for p in second.pending}
    assert second == _cold(state, plans.Observed(), packing.Policy.DEFAULT.value)
    assert len(second.placements) == 2 and len(second.pending) == 1
    assert warm.cold == 1


def test_claims_taken_by_another_reconciler_are_read_not_remembered() -> None:
    state = _fleet(nodes=2, allocations=1, gpus=(8,), seed=4)
    warm = replanning.WarmPlanner()
    first = warm(state, plans.Observed())
    (p,) = first.placements
    # Another reconciler filled the other node; ours never applied its placement.
    other = next(n for n in sorted(state.nodes) if n != p.node)
    db: Claims = {(other, s): _claim("someone-else", other, s) for s in range(8)}
    second = warm(state, _observed(db, plans.Observed()))
    assert [q.node for q in second.placements] == [p.node]
    # Now the database holds the other reconciler's claims on both nodes: nothing fits.
    db.update({(p.node, s): _claim("someone-else-2", p.node, s) for s in range(8)})
    third = warm(state, _observed(db, plans.Observed()))
    assert third.placements == () and [q.code for q in third.pending] == ["plan.sku_unavailable.capacity"]
    assert third == _cold(state, _observed(db, plans.Observed()), packing.Policy.DEFAULT.value)
    assert warm.cold == 1


def test_a_changed_request_time_moves_the_tie_break_of_the_nodes_holding_it() -> None:
    """`default` prefers the node whose oldest allocation is older; the kept keys follow the documents."""
    state = _fleet(nodes=2, allocations=3, gpus=(1,), seed=5)
    first, second, new = (synthetic.allocation_id(j) for j in range(3))
    n0, n1 = sorted(state.nodes)
    db: Claims = {(n0, 0): _claim(first, n0, 0), (n1, 0): _claim(second, n1, 0)}
    observed = _observed(db, plans.Observed())
    assert [p.node for p in planner.plan(state, observed).placements] == [n0]  # holds the older allocation
    warm = replanning.WarmPlanner()
    later = copy.copy(state)
    later.allocations = dict(state.allocations)
    del later.allocations[new]
    assert warm(later, observed).placements == ()  # the kept engine placed nothing on n0 or n1
    state.allocations[first] = state.allocations[first].model_copy(
        update={"requested_at": state.allocations[new].requested_at + dt.timedelta(hours=1)}
    )
    got = warm(state, observed)
    assert [p.node for p in got.placements] == [n1]
    assert got == _cold(state, observed, packing.Policy.DEFAULT.value)
    assert warm.cold == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_the_warm_image_follows_the_observed_cache(policy: str) -> None:
    state = _fleet(nodes=3, allocations=1, gpus=(1,), seed=6)
    n0, n1, n2 = sorted(state.nodes)
    warm = replanning.WarmPlanner(policy)
    for holder in (n2, n1, None, n2):
        cache = {holder: frozenset(DIGESTS)} if holder else {}
        observed = plans.Observed(image_cache=cache)
        got = warm(state, observed)
        assert [p.node for p in got.placements] == [holder or n0]
        assert got == _cold(state, observed, policy)
    assert warm.cold == 1


def test_a_refusal_is_explained_from_the_nodes_as_they_are_now() -> None:
    state = _fleet(nodes=1, allocations=1, gpus=(8,), seed=7)
    (name,) = state.nodes
    warm = replanning.WarmPlanner()
    drained = copy.copy(state)
    drained.nodes = {name: state.nodes[name].model_copy(update={"admin_state": m.AdminState.DRAINING})}
    before = warm(drained, plans.Observed())
    db: Claims = {(name, 0): _claim("someone-else", name, 0)}
    observed = _observed(db, plans.Observed())
    after = warm(state, observed)  # active again, one slot taken: no longer the drained node's reason
    assert [p.code for p in before.pending] != [p.code for p in after.pending]
    assert [p.code for p in after.pending] == ["plan.sku_unavailable.capacity"]
    assert after == _cold(state, observed, packing.Policy.DEFAULT.value)
    assert warm.cold == 1


def test_one_new_allocation_resets_one_node() -> None:
    state = _fleet(nodes=60, allocations=80, gpus=(1, 2, 4), seed=8)
    warm = replanning.WarmPlanner()
    db: Claims = {}
    first = warm(state, _observed(db, plans.Observed()))
    _apply(random.Random(0), dataclasses.replace(first, releases=()), db)  # noqa: S311 - test randomness
    # edited in place, deliberately: the planner must keep its own copy of what it planned from
    state.allocations["one-more"] = state.allocations[synthetic.allocation_id(0)].model_copy(
        update={"id": "one-more", "requested_at": dt.datetime(2027, 1, 1, tzinfo=dt.UTC)}
    )
    second = warm(state, _observed(db, plans.Observed()))
    assert "one-more" in {p.allocation_id for p in second.placements}
    assert warm.last_reset == len({p.node for p in first.placements})  # what plan 1 placed, applied or not
    db = {k: c for k, c in db.items() if c.allocation_id != "one-more"}
    db[(second.placements[-1].node, 7)] = _claim("one-more", second.placements[-1].node, 7)
    third = warm(state, _observed(db, plans.Observed()))
    assert warm.last_reset == len({p.node for p in second.placements})
    assert third == _cold(state, _observed(db, plans.Observed()), packing.Policy.DEFAULT.value)
    assert warm.cold == 1


def test_an_error_in_the_incremental_path_falls_back_to_a_cold_engine(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state = _fleet(nodes=4, allocations=6, gpus=(1, 2), seed=9)
    warm = replanning.WarmPlanner()
    warm(state, plans.Observed())

    def broken(*_args: object, **_kw: object) -> set[str]:
        raise KeyError("node-x")

    monkeypatch.setattr(placing.Engine, "reset_node", broken)
    with caplog.at_level("WARNING", logger="gpuaas.planning"):
        got = warm(state, plans.Observed())  # the last plan placed: its nodes must be reset, and that fails
    assert got == _cold(state, plans.Observed(), packing.Policy.DEFAULT.value)
    assert warm.cold == 2 and "incremental sync failed (KeyError" in warm.last_cold
    assert "building the placement engine cold" in caplog.text
