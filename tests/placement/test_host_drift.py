"""Host-reported drift keeps slots, and node-wide corruption keeps nodes, off the market (issue 26).

Seed 000, "Slice Drift Reconciliation": drift blocks reuse of the affected
slot, unless the evidence points to node-wide corruption. Regression: the
planner's live read took only host health and firmware, so a slot its host
reported drifted (`schedulable: false`) was sold to the next tenant.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from desired import models as m
from host_reconciler import actions
from policies import hostreports, modes
from reconciler.placement import capacity, placing, prplan, reasons, replanning
from tests.placement.pictures import BAREMETAL, REGION, SLICE, aid, world

NOT_VFIO = ("drift.pci.not_vfio",)


def test_the_planner_blocks_exactly_what_the_host_blocks() -> None:
    assert {str(c) for c in actions.BLOCKING_DRIFT} == hostreports.BLOCKING


@pytest.mark.parametrize(
    ("codes", "wipe_failed", "blocked"),
    [
        ((), False, ()),
        (("drift.reservation.stale", "drift.domain.missing"), False, ()),  # heals itself: not blocking
        (("drift.disk.mounted", "drift.reservation.stale"), False, ("drift.disk.mounted",)),
        (("drift.report.invalid",), False, ("drift.report.invalid",)),
        ((), True, ("host.wipe.failed",)),
    ],
)
def test_slot_block(codes: tuple[str, ...], wipe_failed: bool, blocked: tuple[str, ...]) -> None:
    assert hostreports.slot_block(codes, wipe_failed=wipe_failed) == blocked


@pytest.mark.parametrize(
    ("node_codes", "blocked", "reported", "corrupt"),
    [
        ((), 1, 8, ()),
        ((), 7, 8, ()),
        ((), 8, 8, (hostreports.EVERY_SLOT,)),
        ((), 1, 1, ()),  # one slot is not node-wide evidence
        (("drift.network.problem",), 0, 8, ()),  # network problems make the node unhealthy instead
        (("drift.identity.changed",), 0, 8, ("drift.identity.changed",)),
        (("drift.report.invalid",), 0, 0, ("drift.report.invalid",)),
    ],
)
def test_node_corruption(node_codes: tuple[str, ...], blocked: int, reported: int, corrupt: tuple[str, ...]) -> None:
    assert hostreports.node_corruption(node_codes, blocked, reported) == corrupt


def test_a_drifted_free_slot_is_not_placed_until_the_host_reports_it_clear() -> None:
    w = world("""
        n1: [a...|....]
        n2: [....|....]
    """)
    aid = w.request(SLICE, 1)
    assert [(p.node, p.slot_indexes) for p in w.plan().placements] == [("n1", (1,))]
    w.observed = replace(w.observed, slot_blocks=MappingProxyType({("n1", 1): NOT_VFIO}))
    assert [(p.node, p.slot_indexes) for p in w.plan().placements] == [("n1", (2,))]
    # every free slot of n1 drifted: n2 takes it (and n1's held slot stays held)
    w.observed = replace(w.observed, slot_blocks=MappingProxyType({("n1", i): NOT_VFIO for i in range(1, 8)}))
    assert [p.node for p in w.plan().placements if p.allocation_id == aid] == ["n2"]
    engine = placing.Engine(w.desired, w.observed)
    assert engine.mode_facts("n1").free_slots == 0 and engine.mode("n1") is modes.Mode.SLICE_ACTIVE


def test_no_slot_left_names_the_drift() -> None:
    w = world("""
        n1: [....|....]
    """)
    aid = w.request(SLICE, 1)
    w.observed = replace(
        w.observed,
        slot_blocks=MappingProxyType({("n1", i): NOT_VFIO for i in range(7)} | {("n1", 7): ("drift.disk.mounted",)}),
    )
    pending = {q.allocation_id: q for q in w.plan().pending}[aid]
    assert pending.code == reasons.CAPACITY
    assert pending.details["host_drift_slots"] == 8 and "report them clear of drift" in pending.message


def test_a_corrupt_node_takes_nothing_new_and_shows_unavailable() -> None:
    w = world("""
        n1: [a...|....]
        b1: [] bm-only
    """)
    w.observed = replace(
        w.observed, corrupt_nodes=MappingProxyType({"n1": ("drift.identity.changed",), "b1": ("drift.report.invalid",)})
    )
    slice_req, bm_req = w.request(SLICE, 1), w.request(BAREMETAL, 8)
    plan = w.plan()
    assert plan.placements == ()
    codes = {q.allocation_id: q.code for q in plan.pending}
    assert codes == {slice_req: reasons.NODE_CORRUPT, bm_req: reasons.NODE_CORRUPT}
    engine = placing.Engine(w.desired, w.observed)
    assert engine.mode_facts("n1").node_corrupt and engine.mode("n1") is modes.Mode.UNAVAILABLE
    verdict = modes.transition(engine.mode_facts("n1"), modes.Target.SLICE_USE)
    assert (verdict.allowed, verdict.code) == (False, modes.UNAVAILABLE)
    model = capacity.read_model(w.desired, w.observed)
    offers = {o.sku: o for o in model.offers}
    assert offers[SLICE].not_launchable == {"node_corrupt": 7}
    assert offers[BAREMETAL].not_launchable == {"node_corrupt": 2}  # n1 is leased whole too
    assert {n.name: n.corrupt for n in model.nodes}["n1"] == ("drift.identity.changed",)


def test_a_whole_node_lease_waits_for_a_drifted_slot_too() -> None:
    """A baremetal lease reuses every slot of the node: a drifted one blocks it (seed 000)."""
    w = world("""
        n1: [....|....]
    """)
    aid = w.request(BAREMETAL, 8)
    assert [p.node for p in w.plan().placements] == ["n1"]
    w.observed = replace(w.observed, slot_blocks=MappingProxyType({("n1", 3): ("drift.disk.mounted",)}))
    assert {q.allocation_id: q.code for q in w.plan().pending} == {aid: reasons.NO_EMPTY_NODE}
    offers = {o.sku: o for o in capacity.read_model(w.desired, w.observed).offers}
    assert offers[BAREMETAL].not_launchable == {"host_drift": 1}
    assert offers[SLICE].not_launchable == {"host_drift": 1}
    summary = {n.name: n for n in capacity.read_model(w.desired, w.observed).nodes}["n1"]
    assert summary.drifted == ((3, ("drift.disk.mounted",)),) and summary.slots["host_drift"] == 1


def test_the_warm_planner_and_the_pr_plan_follow_the_reports() -> None:
    w = world("""
        n1: [....|....]
        n2: [....|....]
    """)
    w.request(SLICE, 1)
    warm = replanning.WarmPlanner()
    clear = w.observed
    assert [p.node for p in warm(w.desired, clear).placements] == ["n1"]
    drifted = replace(clear, corrupt_nodes=MappingProxyType({"n1": ("drift.identity.changed",)}))
    assert [p.node for p in warm(w.desired, drifted).placements] == ["n2"]
    assert [p.node for p in warm(w.desired, clear).placements] == ["n1"]  # reported clear: back in use
    pr = prplan.compose(w.desired, w.desired, drifted, offline=False)
    assert [p.node for p in pr.plan.placements] == ["n2"]
    offers = {o.sku: o for o in pr.capacity_after.offers}
    assert offers[SLICE].not_launchable["node_corrupt"] == 8


def test_a_refusal_counts_a_drifted_slot_its_release_frees() -> None:
    """The drift count behind a refusal is kept between refusals; a release must renew it."""
    w = world("""
        n1: [a...|....]
    """)
    w.observed = replace(w.observed, slot_blocks=MappingProxyType({("n1", i): NOT_VFIO for i in range(8)}))
    engine = placing.Engine(w.desired, w.observed)
    req = placing.Request("probe", "t", SLICE, 1, REGION)
    assert engine.explain(req).details["host_drift_slots"] == 7  # slot 0 is held
    assert engine.release(aid("a"))
    assert engine.explain(req).details["host_drift_slots"] == 8


def test_a_refusal_reads_the_facts_a_reset_node_brought() -> None:
    """Refusals that read only facts are kept per (SKU, region, tenant); new facts must renew them."""
    w = world("""
        n1: [AAAA|AAAA]
    """)
    engine = placing.Engine(w.desired, w.observed)
    req = placing.Request("probe", "t", SLICE, 1, REGION)
    assert engine.explain(req).code == reasons.CAPACITY
    drained = replace(engine.by_name["n1"].facts, admin_state=m.AdminState.DRAINING)
    engine.reset_node("n1", [c for c in w.observed.claims if c.node == "n1"], drained)
    expected = reasons.static_refusal(engine.facts, w.desired.skus[SLICE], REGION, "t")
    assert expected is not None and engine.explain(req) == expected
