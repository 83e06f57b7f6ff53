"""Lease ends (Allocation.lease_hours): `default` co-locates leases that end together.

Pictures as in tests/placement/pictures.py; `w.lease(letter, hours)` gives a
pictured allocation a reserved term from EPOCH. New requests arrive one
minute apart after EPOCH.
"""

from __future__ import annotations

import datetime as dt
import random

import pydantic
import pytest

from desired import models as m
from policies import packing
from reconciler.placement import placing, reasons, simulation, synthesis
from reconciler.placement.index import EndOrder
from tests.placement.pictures import API, BAREMETAL, EPOCH, SLICE, World, world
from tests.placement.scoring import ranked

H = packing.HOUR_S

THREE_HOSTS = """
n1: [a...|....]
n2: [b...|....]
n3: [c...|....]
"""


def three_hosts() -> World:
    w = world(THREE_HOSTS)
    w.lease("a", 1)  # n1 empties at 1 h
    w.lease("b", 8)  # n2 at 8 h
    w.lease("c", 4)  # n3 at 4 h
    return w


@pytest.mark.parametrize(
    ("hours", "node"),
    [
        (0.5, "n1"),  # ends before every host empties: the one that empties first (least slack)
        (3, "n3"),  # n1 would wait for it; n3 empties soonest after it
        (7, "n2"),  # only n2 is busy longer
        (20, "n2"),  # delays every host: the least delay
        (None, "n1"),  # no term: today's ranking (same pattern, same count and age: node order)
    ],
)
def test_a_lease_joins_the_host_whose_leases_end_with_it(hours: float | None, node: str) -> None:
    assert three_hosts().place(SLICE, 1, lease_hours=hours) == (node, (1,))


def test_alternatives_follow_the_lease_end_order() -> None:
    w = three_hosts()
    aid = w.request(SLICE, 1, lease_hours=3)
    (p,) = w.plan().placements
    assert p.allocation_id == aid and p.node == "n3"
    # n2 takes it without delay (5 h of slack), n1 would empty 2 h later
    assert [c.node for c in p.alternatives] == ["n2", "n1"]


def test_leases_ending_together_share_a_host_that_then_empties_for_baremetal() -> None:
    """
    n1: [aaaa|....]   a ends at 1 h
    n2: [bbbb|....]   b ends at 8 h
    A 7-hour and a 50-minute 4-GPU lease arrive (the long one first). With
    their terms known the long one joins b and the short one joins a, so n1
    is empty after an hour; without, the long one pins n1 too.
    """
    for known, long_node, short_node in ((True, "n2", "n1"), (False, "n1", "n2")):
        w = world(test_leases_ending_together_share_a_host_that_then_empties_for_baremetal.__doc__)
        w.lease("a", 1)
        w.lease("b", 8)
        long = w.request(SLICE, 4, lease_hours=7 if known else None)
        short = w.request(SLICE, 4, lease_hours=50 / 60 if known else None)
        placed = {p.allocation_id: p.node for p in w.plan().placements}
        assert placed == {long: long_node, short: short_node}

        # one hour on: a and the short lease are over; is a host empty for a whole-node lease?
        engine = placing.Engine(w.desired, w.observed)
        for aid in (long, short):
            alloc = w.desired.allocations[aid]
            assert isinstance(
                engine.place(
                    placing.Request(
                        aid,
                        "t",
                        SLICE,
                        4,
                        "r1",
                        requested_at=alloc.requested_at.timestamp(),
                        ends_at=placing.lease_end(alloc),
                    )
                ),
                placing.Placed,
            )
        assert engine.release("alloc-a") and engine.release(short)
        bare = engine.place(placing.Request("bm", "t", BAREMETAL, 8, "r1"))
        if known:
            assert isinstance(bare, placing.Placed) and bare.node == "n1"
        else:
            assert isinstance(bare, placing.Refused) and bare.code == reasons.NO_EMPTY_NODE


@pytest.mark.parametrize(("sku", "gpus"), [(SLICE, 1), (SLICE, 2), (SLICE, 4), (SLICE, 8), (BAREMETAL, 8)])
def test_a_request_without_a_term_ignores_the_terms_of_others(sku: str, gpus: int) -> None:
    """Absent lease_hours, the ranking is today's whatever the other leases say."""
    plain = world(THREE_HOSTS)  # no allocation has a term
    assert three_hosts().place(sku, gpus) == plain.place(sku, gpus)


def test_a_clean_host_is_still_opened_last() -> None:
    """
    n1: [aaaa|aaa.]   a ends in 10 minutes
    n2: [....|....]
    A 5-hour lease would keep n1 busy 5 hours longer, but a slice never opens
    a clean host while a used one can take it (seed 000): n2 stays whole.
    """
    w = world(test_a_clean_host_is_still_opened_last.__doc__)
    w.lease("a", 1 / 6)
    assert w.place(SLICE, 1, lease_hours=5) == ("n1", (7,))


# ------------------------------------------------------------------ engine


def _brute_force(engine: placing.Engine, req: placing.Request) -> tuple[str, tuple[int, ...]] | None:
    """The documented ranking's first choice, by scoring every node: what the index must agree with."""
    found = ranked(engine, req)
    return found[0] if found else None


@pytest.mark.parametrize("weight", [1.0, 0.0, 5.0])
def test_index_agrees_with_scoring_every_node(weight: float) -> None:
    desired = synthesis.desired_state(synthesis.fleet_documents(10))
    assert desired.fleet is not None
    desired.fleet = desired.fleet.model_copy(
        update={"placement": desired.fleet.placement.model_copy(update={"lease_end_weight": weight})}
    )
    engine = placing.Engine(desired)
    rnd = random.Random(7)  # noqa: S311  # seeded, reproducible simulation input, not security
    live: list[str] = []
    now = 0.0
    for i in range(700):
        now += rnd.expovariate(1 / 300)
        if live and rnd.random() < 0.45:
            assert engine.release(live.pop(rnd.randrange(len(live))))  # in any order: some run past their end
            continue
        gpus = rnd.choice((1, 1, 1, 2, 2, 4))
        term = rnd.choice((None, 0.2, 1.0, 3.0, 9.0, 30.0))  # hours; None: on-demand
        req = placing.Request(
            f"r{i}",
            "t",
            synthesis.H200_SLICE,
            gpus,
            synthesis.REGION,
            requested_at=now,
            ends_at=None if term is None else now + term * H,
        )
        expected = _brute_force(engine, req)
        out = engine.place(req)
        if expected is None:
            assert isinstance(out, placing.Refused)
            continue
        assert isinstance(out, placing.Placed)
        assert (out.node, out.slot_indexes) == expected, f"step {i}: {req}"
        live.append(req.allocation_id)


def test_requests_without_terms_place_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The end-ordered index (kept under `default`) changes nothing for leases without a term."""
    desired = synthesis.desired_state(synthesis.fleet_documents(12))
    runs = []
    for by_end in (True, False):
        if not by_end:  # today's engine: no end order at all
            monkeypatch.setattr(packing, "uses_lease_ends", lambda policy: False)
        engine = placing.Engine(desired)
        assert engine.state.by_end is by_end
        rnd = random.Random(3)  # noqa: S311  # seeded, reproducible simulation input, not security
        live: list[str] = []
        placed = []
        for i in range(500):
            if live and rnd.random() < 0.45:
                engine.release(live.pop(rnd.randrange(len(live))))
                continue
            sku, gpus = rnd.choice(
                [(synthesis.H200_SLICE, g) for g in (1, 1, 2, 4, 8)] + [(synthesis.H200_BAREMETAL, 8)]
            )
            out = engine.place(
                placing.Request(f"r{i}", "t", sku, gpus, synthesis.REGION, requested_at=float(i)), alternatives=2
            )
            placed.append(out)
            if isinstance(out, placing.Placed):
                live.append(f"r{i}")
        runs.append(placed)
    assert runs[0] == runs[1]


def test_end_order_queries() -> None:
    o = EndOrder()
    o.add(1, 5 * H, (0, 1))
    o.add(2, 9 * H, (0, 2))
    o.add(3, 5 * H, (-1, 3))  # ties with node 1 on end; smaller key
    o.add(4, packing.EMPTY, (0, 4))
    o.add(5, packing.EMPTY, (0, 5))
    o.add(6, packing.NO_END, (0, 6))
    assert len(o) == 6
    assert o.at_or_after(4 * H) == (5 * H, (-1, 3), 3)
    assert o.at_or_after(6 * H) == (9 * H, (0, 2), 2)
    assert o.at_or_after(10 * H) == (packing.NO_END, (0, 6), 6)
    assert o.latest_before(9 * H) == (5 * H, (-1, 3), 3)  # the latest end, least key among equals
    assert o.latest_before(5 * H) is None  # empty nodes are not in the sorted part
    assert o.first_empty() == (packing.EMPTY, (0, 4), 4)
    o.add(3, 10 * H, (-2, 3))  # re-keyed: moves
    assert o.at_or_after(4 * H) == (5 * H, (0, 1), 1)
    o.discard(4)
    o.discard(4)  # twice is harmless
    assert o.first_empty() == (packing.EMPTY, (0, 5), 5)
    assert {n for _, _, n in o.around(7 * H, 1)} == {2, 1, 5}
    for n in (1, 2, 3, 5, 6):
        o.discard(n)
    assert len(o) == 0 and o.at_or_after(0.0) is None and o.first_empty() is None


# --------------------------------------------------------------- simulate


def test_simulate_passes_exact_departures_as_lease_ends_only_default_reads_them() -> None:
    desired = synthesis.desired_state(synthesis.fleet_documents(6))
    offers = simulation.offers(desired, dict(synthesis.DEFAULT_MIX))
    rows = synthesis.workload_rows(
        offers, load=1.0, requests=3000, seed=2, baremetal=(synthesis.H200_BAREMETAL, 0.1), duration_sigma=1.5
    )
    exact, none = simulation.LeaseEnds.EXACT, simulation.LeaseEnds.NONE
    for policy in ("first-fit", "seed-rank"):
        a = simulation.simulate(desired, rows, policy=policy, lease_ends=exact)
        b = simulation.simulate(desired, rows, policy=policy, lease_ends=none)
        assert (a.accepted_gpus, a.rejections) == (b.accepted_gpus, b.rejections)
        assert a.as_dict()["lease_ends"] is True and b.as_dict()["lease_ends"] is False
    known = simulation.simulate(desired, rows, policy="default", lease_ends=exact)
    blind = simulation.simulate(desired, rows, policy="default", lease_ends=none)
    assert known.accepted_gpus != blind.accepted_gpus  # the ends change default's choices


# ------------------------------------------------------------------- model


def _alloc(**extra: object) -> m.Allocation:
    return m.Allocation.model_validate(
        {
            "apiVersion": API,
            "kind": "Allocation",
            "id": "alloc-1",
            "tenant": "t",
            "sku": SLICE,
            "gpu_count": 1,
            "region": "r1",
            "requested_at": EPOCH,
            **extra,
        }
    )


def test_lease_hours_is_optional_and_positive() -> None:
    assert _alloc().lease_hours is None and placing.lease_end(_alloc()) is None
    term = _alloc(lease_hours=72)
    assert term.lease_hours == 72.0
    assert placing.lease_end(term) == (EPOCH + dt.timedelta(hours=72)).timestamp()
    for bad in (0, -1, float("inf"), "72"):
        with pytest.raises(pydantic.ValidationError):
            _alloc(lease_hours=bad)
