"""`default` on demand: node facts between the pattern's scores (`packing.place_key`, `packing.lease_key`).

Pictures as in tests/placement/pictures.py. The rule, measured in
docs/placement.md ("On demand"): no clean node while a used one fits, no set
spanning NUMA groups while an aligned one fits, then the node holding more
allocations, the aligned shape, the oldest allocation, the fragmentation rise.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest

from desired import models as m
from policies import packing
from reconciler.placement import placing, synthesis
from tests.placement.pictures import API, EPOCH, REGION, SLICE, World, aid, world
from tests.placement.scoring import ranked

H = packing.HOUR_S


def _since(w: World, letter: str, hours_before: float, lease_hours: float | None = None) -> None:
    """Declare a pictured slice allocation, requested `hours_before` EPOCH."""
    held = [c for c in w.observed.claims if c.allocation_id == aid(letter)]
    w.desired.allocations[aid(letter)] = m.Allocation.model_validate(
        {
            "apiVersion": API,
            "kind": "Allocation",
            "id": aid(letter),
            "tenant": "t",
            "sku": SLICE,
            "gpu_count": len(held),
            "region": REGION,
            "requested_at": EPOCH - dt.timedelta(hours=hours_before),
            "lease_hours": lease_hours,
        }
    )


def test_the_node_with_more_allocations_wins_over_a_smaller_fragmentation_rise() -> None:
    """
    n1: [ab..|....]
    n2: [c...|....]
    n2 would complete its broken pair (the smaller rise); n1 holds two
    allocations and empties later anyway, so it takes the new one and n2
    keeps draining.
    """
    w = world(test_the_node_with_more_allocations_wins_over_a_smaller_fragmentation_rise.__doc__)
    assert w.place(SLICE, 1) == ("n1", (2,))
    assert w.place(SLICE, 1, policy="seed-rank")[0] == "n1"  # a baseline, for contrast: unchanged rules


def test_a_set_spanning_numa_groups_comes_after_any_aligned_one() -> None:
    """
    n1: [abc.|def.]
    n2: [g...|....]
    n1 holds six allocations, but its two free slots sit in different NUMA
    groups: a 2-GPU VM goes to an aligned pair on n2.
    """
    w = world(test_a_set_spanning_numa_groups_comes_after_any_aligned_one.__doc__)
    assert w.place(SLICE, 2) == ("n2", (2, 3))


def test_more_allocations_come_before_a_whole_pair() -> None:
    """
    n1: [a.b.|cdef]
    n2: [g...|....]
    n1's free slots are in one NUMA group but split across its pairs: with
    six allocations it still wins over n2's whole pair.
    """
    w = world(test_more_allocations_come_before_a_whole_pair.__doc__)
    assert w.place(SLICE, 2) == ("n1", (1, 3))


@pytest.mark.parametrize(("older", "node"), [("a", "n1"), ("b", "n2")])
def test_the_older_allocation_wins_over_a_smaller_fragmentation_rise(older: str, node: str) -> None:
    """
    n1: [a...|....]
    n2: [bb..|....]
    One allocation each, whole pairs free on both. n1's free pattern takes a
    single GPU with the smaller rise, but a node pinned by an allocation that
    has run for a day is the one that stays busy: it takes the new one.
    """
    w = world(test_the_older_allocation_wins_over_a_smaller_fragmentation_rise.__doc__)
    _since(w, older, 24)
    _since(w, "b" if older == "a" else "a", 0.5)
    assert w.place(SLICE, 1)[0] == node


def test_a_lease_with_a_term_also_joins_the_node_with_more_allocations() -> None:
    """
    n1: [a...|....]   a ends at 1 h
    n2: [bc..|....]   b and c end at 8 h
    A half-hour lease delays neither host. By its end alone it would join n1
    (least slack); n2 holds more allocations and wins (`packing.lease_key`).
    """
    w = world(test_a_lease_with_a_term_also_joins_the_node_with_more_allocations.__doc__)
    w.lease("a", 1)
    w.lease("b", 8)
    w.lease("c", 8)
    assert w.place(SLICE, 1, lease_hours=0.5)[0] == "n2"


def test_place_key_orders_its_terms() -> None:
    aligned, split, spread = (0.0, 0.0, 0.5), (0.0, 1.0, -1.0), (0.0, 2.0, -2.0)
    clean = (1.0, 0.0, -3.0)
    full, few = (-5.0, 100.0, 9.0), (-1.0, 0.0, 1.0)
    key = packing.place_key
    assert key(spread, full) > key(aligned, few)  # spread last, whatever the node
    assert key(clean, few) > key(spread, full)  # a clean node after everything
    assert key(split, full) < key(aligned, few)  # allocations before the split pair
    assert key(aligned, (-1.0, 0.0, 2.0)) < key(split, (-1.0, 0.0, 1.0))  # equal count: the aligned shape
    older = packing.AGE_CLASS_S  # one age class later
    assert key(aligned, (-1.0, 0.0, 2.0)) < key((0.0, 0.0, -1.0), (-1.0, older, 1.0))  # then the oldest class
    # in one age class the gradient decides, then the exact time (issue 31)
    assert key(aligned, (-1.0, 0.0, 2.0)) > key((0.0, 0.0, -1.0), (-1.0, older - 1, 1.0))
    assert key(aligned, (-1.0, 0.0, 2.0)) < key(aligned, (-1.0, 5.0, 1.0))
    assert packing.place_bound(spread) == key(spread, full)[:2]


def test_lease_bound_is_a_lower_bound_of_lease_key() -> None:
    rnd = random.Random(11)  # noqa: S311  # seeded, reproducible test input, not security
    for _ in range(500):
        rank = (float(rnd.random() < 0.2), float(rnd.randrange(3)), round(rnd.uniform(-1, 2), 1))
        node = (-float(rnd.randrange(8)), rnd.uniform(0, 1e5), float(rnd.randrange(100)))
        start = rnd.uniform(0, 1e5)
        end = start + rnd.uniform(0, 30) * H
        node_end = rnd.choice((packing.EMPTY, packing.NO_END, start + rnd.uniform(-5, 40) * H))
        lease = packing.lease_rank(rank, node_end, start, end, rnd.choice((0.0, 1.0, 5.0)))
        assert packing.lease_bound(rank, node[0]) <= packing.lease_key(lease, node)[:5]


# ------------------------------------------------------------------ engine


@pytest.mark.parametrize("terms", [False, True])
def test_index_agrees_with_scoring_every_node(terms: bool) -> None:
    """Choice and alternatives (on demand) equal a brute-force ranking of every node, over a long random stream."""
    desired = synthesis.desired_state(synthesis.fleet_documents(10))
    engine = placing.Engine(desired)
    rnd = random.Random(5)  # noqa: S311  # seeded, reproducible simulation input, not security
    live: list[str] = []
    now = 0.0
    placed = 0
    for i in range(800):
        now += rnd.expovariate(1 / 300)
        if live and rnd.random() < 0.45:
            assert engine.release(live.pop(rnd.randrange(len(live))))
            continue
        gpus = rnd.choice((1, 1, 1, 2, 2, 4))
        term = rnd.choice((None, 0.2, 1.0, 9.0)) if terms else None
        req = placing.Request(
            f"r{i}",
            "t",
            synthesis.H200_SLICE,
            gpus,
            synthesis.REGION,
            requested_at=now,
            ends_at=None if term is None else now + term * H,
        )
        order = ranked(engine, req)
        out = engine.place(req, alternatives=3)
        if not order:
            assert isinstance(out, placing.Refused)
            continue
        assert isinstance(out, placing.Placed)
        assert (out.node, out.slot_indexes) == order[0], f"step {i}: {req}"
        if term is None:
            assert [(c.node, c.slot_indexes) for c in out.alternatives] == order[1:4], f"step {i}"
        live.append(req.allocation_id)
        placed += 1
    assert placed > 300  # the stream kept the fleet busy: many choices were real ones
