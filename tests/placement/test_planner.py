"""plan(desired, observed): releases, idempotence, determinism, alternatives, the example fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from desired import models as m
from reconciler import plans, sources
from reconciler.placement import placing, planner, reasons
from schemas import states
from tests.placement import pictures
from tests.placement.pictures import BAREMETAL, SLICE, world

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"


def test_example_fleet_plans_every_present_allocation() -> None:
    loaded = sources.load(EXAMPLES)
    assert not loaded.errors
    desired = loaded.state
    result = planner.plan(desired, plans.Observed())
    present = {a.id for a in desired.allocations.values() if a.state is m.AllocationState.PRESENT}
    placed = {p.allocation_id for p in result.placements}
    pending = {p.allocation_id: p for p in result.pending}
    assert placed | set(pending) == present
    assert not placed & set(pending)
    for p in pending.values():
        assert p.code.startswith("plan.") and p.message
    for p in result.placements:
        node = desired.nodes[p.node]
        assert node.region == p.region
        if p.capacity_shape == "gpu_slice":
            assert p.profile is not None and p.profile.gpu_count == p.gpu_count
            assert len(p.slot_indexes) == p.gpu_count
        assert p.image is not None
    # the AMD request goes to the RoCE host, the baremetal lease to a baremetal-only host
    by_id = {p.allocation_id: p for p in result.placements}
    assert by_id["alloc-0005"].node == "mi300x-euw1-r01"
    assert by_id["alloc-0004"].node == "h200-use1-b02"  # acme-research's own node (dedicated first)


def test_released_allocations_with_claims_become_releases() -> None:
    """
    n1: [aa..|bbbb]
    n2: [CCCC|CCCC]
    """
    w = world(test_released_allocations_with_claims_become_releases.__doc__)
    for letter, sku, gpus in (("a", SLICE, 2), ("b", SLICE, 4), ("C", BAREMETAL, 8)):
        aid = pictures.aid(letter)
        w.request(sku, gpus, aid=aid)
        w.desired.allocations[aid] = w.desired.allocations[aid].model_copy(update={"state": m.AllocationState.RELEASED})
    result = w.plan()
    assert result.releases == (
        plans.Release("alloc-a", "n1", (0, 1)),
        plans.Release("alloc-b", "n1", (4, 5, 6, 7)),
        plans.Release("alloc-bm-c", "n2", (0, 1, 2, 3, 4, 5, 6, 7)),
    )
    assert not result.placements and not result.pending


def test_releasing_claims_are_not_released_twice_and_still_block() -> None:
    w = world("n1: [....|....]")
    w.observed = plans.Observed(
        claims=tuple(
            plans.ExistingClaim("old", "n1", states.ClaimKind.SLOT, s, states.ClaimStatus.RELEASING) for s in range(8)
        )
    )
    w.request(SLICE, 1, aid="old")
    w.desired.allocations["old"] = w.desired.allocations["old"].model_copy(update={"state": m.AllocationState.RELEASED})
    assert w.plan().releases == ()
    assert w.place(SLICE, 1) == reasons.CAPACITY  # slots stay claimed until cleanup


def test_placed_allocations_are_never_placed_again() -> None:
    """
    n1: [a...|....]
    """
    w = world(test_placed_allocations_are_never_placed_again.__doc__)
    w.request(SLICE, 1, aid="alloc-a")  # holds slot 0 already
    w.request(SLICE, 1, aid="alloc-z")  # the store says it holds claims (a race with apply)
    w.observed = plans.Observed(claims=w.observed.claims, placed=frozenset({"alloc-a", "alloc-z"}))
    assert w.plan().empty


def test_plan_is_deterministic_and_pure() -> None:
    """
    n1: [a...|b...]
    n2: [....|....]
    n3: [cc..|dddd]
    """
    w = world(test_plan_is_deterministic_and_pure.__doc__)
    for gpus in (1, 2, 4, 1, 8, 2):
        w.request(SLICE, gpus)
    w.request(BAREMETAL, 8)
    first, second = w.plan(), w.plan()
    assert first == second
    claimed = [(p.node, s) for p in first.placements for s in p.slot_indexes]
    assert len(claimed) == len(set(claimed)), "no slot is sold twice within one plan"


def test_alternatives_are_distinct_next_best_nodes() -> None:
    """
    n1: [abc.|....]
    n2: [de..|....]
    n3: [f...|....]
    n4: [....|....]
    """
    w = world(test_alternatives_are_distinct_next_best_nodes.__doc__)
    w.request(SLICE, 1)
    (p,) = w.plan().placements
    assert (p.node, p.slot_indexes) == ("n1", (3,))
    nodes = [c.node for c in p.alternatives]
    # n2 holds more allocations than n3 (packing.place_key: before the fragmentation rise); the clean n4 comes last
    assert nodes == ["n2", "n3", "n4"]
    assert p.node not in nodes
    assert all(len(c.slot_indexes) == 1 for c in p.alternatives)


def test_alternatives_do_not_leak_into_later_placements() -> None:
    """
    n1: [....|....]
    n2: [....|....]
    """
    w = world(test_alternatives_do_not_leak_into_later_placements.__doc__)
    w.request(BAREMETAL, 8)
    w.request(BAREMETAL, 8)
    a, b = w.plan().placements
    assert (a.node, b.node) == ("n1", "n2")
    assert [c.node for c in a.alternatives] == ["n2"]
    assert b.alternatives == ()


@pytest.mark.parametrize("policy", ["default", "first-fit", "k8s-least-allocated", "k8s-most-allocated", "seed-rank"])
def test_every_policy_plans_the_example_fleet(policy: str) -> None:
    desired = sources.load(EXAMPLES).state
    result = planner.plan(desired, plans.Observed(), policy=policy)
    assert len(result.placements) + len(result.pending) == 7


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown placement policy"):
        planner.plan(world("n1: [....|....]").desired, plans.Observed(), policy="best-guess")


def test_profile_is_snapshotted_into_the_placement() -> None:
    w = world("n1: [....|....]")
    w.request(SLICE, 4)
    (p,) = w.plan().placements
    assert p.profile == plans.ResolvedProfile("h200_4g_96c_256g", 4, 96, 262144, derived=True)


def test_plan_and_the_engine_agree_request_by_request() -> None:
    """
    n1: [ab..|....]
    n2: [....|cc..]
    n3: [....|....]
    """
    w = world(test_plan_and_the_engine_agree_request_by_request.__doc__)
    asks = [(SLICE, 1), (SLICE, 2), (BAREMETAL, 8), (SLICE, 4), (SLICE, 1), (BAREMETAL, 8), (SLICE, 8)]
    ids = [w.request(sku, gpus) for sku, gpus in asks]
    result = w.plan()
    engine = placing.Engine(w.desired, w.observed)
    by_id = {p.allocation_id: (p.node, p.slot_indexes) for p in result.placements}
    pending = {p.allocation_id: p.code for p in result.pending}
    for aid, (sku, gpus) in zip(ids, asks, strict=True):
        a = w.desired.allocations[aid]
        out = engine.place(placing.Request(aid, a.tenant, sku, gpus, a.region, None, a.requested_at.timestamp()))
        if isinstance(out, placing.Placed):
            assert by_id[aid] == (out.node, out.slot_indexes)
        else:
            assert pending[aid] == out.code


def _no_engine(*args: object, **kwargs: object) -> placing.Engine:
    raise AssertionError("an engine was built for a plan with nothing to decide")


def test_nothing_to_decide_builds_no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """An inventory with no requests (a first apply) plans without indexing every node and slot."""
    desired = sources.load(EXAMPLES).state
    desired.allocations = {}
    monkeypatch.setattr(placing, "Engine", _no_engine)
    assert planner.plan(desired, plans.Observed()) == plans.Plan((), (), ())
    with pytest.raises(ValueError, match="unknown placement policy 'tetris'"):
        planner.plan(desired, plans.Observed(), policy="tetris")


def test_a_release_or_a_request_still_builds_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    desired = sources.load(EXAMPLES).state
    monkeypatch.setattr(placing, "Engine", _no_engine)
    with pytest.raises(AssertionError, match="nothing to decide"):
        planner.plan(desired, plans.Observed())  # its present requests are placed
    present = [a for a in desired.allocations.values() if a.state is m.AllocationState.PRESENT]
    held = plans.Observed(placed=frozenset(a.id for a in present))
    assert held.placed
    planner.plan(desired, held)  # every request already holds claims and none is released: no engine
    released = {a.id: a.model_copy(update={"state": m.AllocationState.RELEASED}) for a in present[:1]}
    desired.allocations = {**desired.allocations, **released}
    claim = plans.ExistingClaim(
        allocation_id=present[0].id,
        node="h200-use1-b01",
        kind=states.ClaimKind.SLOT,
        slot_index=0,
        status=states.ClaimStatus.ACTIVE,
    )
    with pytest.raises(AssertionError, match="nothing to decide"):
        planner.plan(desired, plans.Observed(claims=(claim,), placed=held.placed))
