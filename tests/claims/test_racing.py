"""Four reconciler processes racing for the last free slots never sell one twice."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import random

from gpuaas_tools.bench import synthetic
from reconciler.plans import Candidate, Placement
from reconciler.store import checks, claims, inventory, live
from reconciler.store.connections import Connection
from tests.claims import racers, util

WORKERS = 4


def _run(db_url: str, plans: list[list[Placement]]) -> list[tuple[str, bool, str | None, tuple[int, ...], int]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(plans))
    results = ctx.Queue()
    procs = [ctx.Process(target=racers.race, args=(db_url, plan, barrier, results)) for plan in plans]
    for p in procs:
        p.start()
    out = [row for _ in procs for row in results.get(timeout=120)]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


def test_four_processes_racing_for_the_last_free_slots(db_url: str, conn: Connection) -> None:
    state = synthetic.fleet(nodes=2, allocations=34)
    inventory.sync(conn, state)
    ids = sorted(state.allocations)
    # Fill all but the last 6 of the 16 slots.
    for p in synthetic.first_fit(state, live.free_slots(conn), ids[:10]):
        assert claims.place(conn, p).placed
    free = live.free_slots(conn)
    last = [(n, i) for n, slots in free.items() for i in slots]
    assert len(last) == 6
    plans = []
    for w in range(WORKERS):
        mine = ids[10 + 6 * w : 16 + 6 * w]
        order = last[:]
        random.Random(w).shuffle(order)  # noqa: S311 - test randomness
        # Every racer aims at the same six slots, each with all of them as candidates.
        plans.append([synthetic.first_fit(state, free, [aid])[0] for aid in mine])
        plans[-1] = [
            dataclasses.replace(
                p,
                node=order[k % 6][0],
                slot_indexes=(order[k % 6][1],),
                alternatives=tuple(Candidate(n, (i,)) for n, i in order if (n, i) != order[k % 6]),
            )
            for k, p in enumerate(plans[-1])
        ]
    results = _run(db_url, plans)
    placed = [r for r in results if r[1]]
    assert len(placed) == 6, results
    assert len({(r[2], r[3]) for r in placed}) == 6  # six different slots
    assert sum(r[4] for r in results) > 0  # they did race
    assert checks.run(conn) == []
    assert (
        util.count(
            conn,
            "SELECT count(*) FROM allocations WHERE status = 'pending' AND pending_code = 'claim.conflict_exhausted'",
        )
        == 18
    )


def test_baremetal_and_slices_racing_for_one_node(db_url: str, conn: Connection) -> None:
    state = synthetic.fleet(nodes=1, allocations=8, baremetal_allocations=2)
    inventory.sync(conn, state)
    ids = sorted(state.allocations)
    slices = synthetic.first_fit(state, live.free_slots(conn), ids[:8])
    bare = synthetic.first_fit(state, {}, ids[8:], idle=["node-00000"])
    assert len(bare) == 1  # the local plan only has one idle node for two leases
    bare.append(dataclasses.replace(bare[0], allocation_id=ids[9]))
    plans = [slices[:4], [bare[0]], slices[4:], [bare[1]]]
    results = _run(db_url, plans)
    placed = {r[0] for r in results if r[1]}
    leases = placed & set(ids[8:])
    assert len(leases) <= 1
    if leases:
        assert placed == leases  # a lease took the node: no slice got in
    else:
        assert placed <= set(ids[:8]) and placed
    assert checks.run(conn) == []
