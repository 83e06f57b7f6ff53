"""Index structures (reconciler.placement.index) and the engine's bookkeeping."""

from __future__ import annotations

import random

import pytest

from reconciler import plans
from reconciler.placement import fleetgraph, placing, synthesis
from reconciler.placement.index import NodeHeap, SliceIndex
from schemas import states
from tests.placement.pictures import BAREMETAL, SLICE, world


def test_node_heap_orders_and_forgets() -> None:
    h = NodeHeap()
    for node, key in ((3, (0, 3)), (1, (5, 1)), (2, (0, 2))):
        h.add(node, key)
    assert h.peek() == ((0, 2), 2)
    h.discard(2)
    assert h.peek() == ((0, 3), 3)
    h.add(3, (9, 3))  # re-keyed: the stale entry must not win
    assert h.peek() == ((5, 1), 1)
    h.discard(1)
    h.discard(3)
    assert h.peek() is None and len(h) == 0


def test_node_heap_smallest_walks_heads_without_popping() -> None:
    h = NodeHeap()
    for node in range(20):
        h.add(node, (node % 7, node))
    h.discard(0)
    h.add(7, (99, 7))  # re-keyed: its old entry is stale
    assert h.smallest(4) == [((0, 14), 14), ((1, 1), 1), ((1, 8), 8), ((1, 15), 15)]
    assert h.peek() == ((0, 14), 14)  # nothing was popped
    assert len(h.smallest(100)) == 19


def test_node_heap_compacts_after_churn() -> None:
    h = NodeHeap()
    for i in range(1000):
        h.add(i % 10, (i,))
        if i % 3 == 0:
            h.discard(i % 10)
    assert len(h._heap) <= 2 * len(h) + 64 + 1000 // 3  # bounded, not one entry per update
    assert h.peek() is not None


def test_slice_index_counts_follow_adds_and_removes() -> None:
    part = SliceIndex(mix_id=0)
    part.add(1, sig=7, bucket=(0, 0b1111), free=4, key=(1,))
    part.add(2, sig=7, bucket=(0, 0b11110000), free=4, key=(2,))
    part.add(3, sig=9, bucket=(0, 0), free=0, key=(3,))
    assert (part.free_gpus, part.nodes_with_free, len(part), part.sig_count) == (8, 2, 3, {7: 2, 9: 1})
    part.remove(1)
    part.remove(3)
    assert (part.free_gpus, part.nodes_with_free, len(part), part.sig_count) == (4, 1, 1, {7: 1})
    assert list(part.buckets[7]) == [(0, 0b11110000)]


def _snapshot(engine: placing.Engine) -> dict[int, object]:
    out: dict[int, object] = {}
    for node in engine.state.nodes:
        views = []
        for part, _lid, _lay in node.views:
            sig, bucket, free = part.place[node.id]
            views.append((sig, bucket, free))
        wholes = [node.id in w.empty for w in node.wholes]
        out[node.id] = (sorted(node.allocs.items()), views, wholes)
    return out


@pytest.mark.parametrize("policy", ["default", "first-fit", "seed-rank"])
def test_release_restores_the_index_exactly(policy: str) -> None:
    desired = synthesis.desired_state(synthesis.fleet_documents(12))
    engine = placing.Engine(desired, policy=policy)
    before = _snapshot(engine)
    rnd = random.Random(4)  # noqa: S311  # seeded, reproducible simulation input, not security
    live: list[str] = []
    for i in range(400):
        if live and rnd.random() < 0.45:
            assert engine.release(live.pop(rnd.randrange(len(live))))
            continue
        sku, gpus = rnd.choice([(synthesis.H200_SLICE, g) for g in (1, 1, 2, 4, 8)] + [(synthesis.H200_BAREMETAL, 8)])
        out = engine.place(placing.Request(f"r{i}", "t", sku, gpus, synthesis.REGION))
        if isinstance(out, placing.Placed):
            live.append(f"r{i}")
        # invariants after every step: indexes agree with the claims
        for node in engine.state.nodes:
            claimed = node.claimed
            for part, _lid, lay in node.views:
                _, (_, mask), free = part.place[node.id]
                assert mask == lay.full & ~claimed and free == mask.bit_count()
            for w in node.wholes:
                assert (node.id in w.empty) is (not node.allocs)
        assert engine.empty_nodes == sum(1 for n in engine.state.nodes if not n.allocs)
    for aid in live:
        engine.release(aid)
    assert _snapshot(engine) == before
    assert not engine.release("never-placed")


def test_engine_modes_follow_claims() -> None:
    """
    n1: [a...|....]
    n2: [AAAA|AAAA]
    n3: [....|....] draining
    n4: [!...|....]
    b1: [] bm-only
    """
    w = world(test_engine_modes_follow_claims.__doc__)
    engine = placing.Engine(w.desired, w.observed)
    assert {n: engine.mode(n).value for n in ("n1", "n2", "n3", "n4", "b1")} == {
        "n1": "slice_active",
        "n2": "baremetal_active",
        "n3": "draining",
        "n4": "cleanup_blocked",
        "b1": "baremetal_only",
    }
    facts = engine.mode_facts("n1")
    assert (facts.slot_claims, facts.free_slots) == (1, 7)


def test_engine_reports_claims_it_cannot_map() -> None:
    w = world("n1: [....|....]")
    observed = plans.Observed(
        claims=(
            plans.ExistingClaim("x1x", "ghost", states.ClaimKind.SLOT, 0, states.ClaimStatus.ACTIVE),
            plans.ExistingClaim("x2x", "n1", states.ClaimKind.SLOT, 42, states.ClaimStatus.ACTIVE),
        )
    )
    engine = placing.Engine(w.desired, observed)
    assert len(engine.warnings) == 2


def test_place_is_idempotent_per_allocation() -> None:
    w = world("n1: [....|....]")
    engine = placing.Engine(w.desired, w.observed)
    req = placing.Request("alloc-1", "t", SLICE, 2, "r1")
    first = engine.place(req)
    again = engine.place(req)
    assert isinstance(first, placing.Placed) and isinstance(again, placing.Placed)
    assert (first.node, first.slot_indexes) == (again.node, again.slot_indexes)
    assert isinstance(engine.place(placing.Request("alloc-2", "t", BAREMETAL, 8, "r1")), placing.Refused)


def test_graph_mirrors_the_topology() -> None:
    """
    n1: [a...|....]
    n2: [....|....] roce region=r2
    """
    w = world(test_graph_mirrors_the_topology.__doc__)
    nodes = fleetgraph.inventory(w.desired, w.observed)
    g = fleetgraph.graph(nodes, w.observed.claims)
    assert set(g.successors(("region", "r1"))) == {("pool", "r1", "p1")}
    assert set(g.successors(("node", "n1"))) == {("group", "n1", "numa0"), ("group", "n1", "numa1")}
    assert set(g.successors(("pair", "n1", "numa0", "numa0-pair0"))) == {("slot", "n1", "0"), ("slot", "n1", "1")}
    slot = g.nodes["slot", "n1", "0"]
    assert slot["claim"] == "alloc-a" and slot["fabric_vf_pci_address"] == "0000:40:00.1"
    assert g.nodes["slot", "n2", "3"]["fabric"] == "roce"
    assert fleetgraph.free_slots(g, "n1") == [1, 2, 3, 4, 5, 6, 7]
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "slot") == 16
