"""Worker processes for the race and kill tests (importable by multiprocessing's spawn)."""

from __future__ import annotations

import sys
from typing import Any

from reconciler.plans import Placement


def race(url: str, placements: list[Placement], barrier: Any, results: Any) -> None:
    """Wait for every racer, then place one transaction each; report what happened."""
    from reconciler.store import applying, connections

    conn = connections.connect(url, autocommit=True)
    barrier.wait()
    out = []
    for p in placements:
        r = applying.place(conn, p, max_attempts=1 + len(p.alternatives))
        out.append((p.allocation_id, r.placed, r.node, r.slot_indexes, r.conflicts))
    conn.close()
    results.put(out)


def apply_forever(url: str, seed: int) -> None:
    """Place and release synthetic allocations until killed (the SIGKILL test's victim)."""
    import random

    from reconciler.plans import Release
    from reconciler.store import applying, cleanup, connections, history, observing, synthetic
    from tests.claims.test_kill import kill_fleet

    state = kill_fleet()
    rng = random.Random(seed)  # noqa: S311 - test randomness
    conn = connections.connect(url, autocommit=True)
    print("ready", flush=True)
    while True:
        # Each round is a recorded reconciliation: a kill leaves its row running until swept.
        run_id = history.start(conn, revision=f"kill-{seed}", source="kill-test")
        pending = [r[0] for r in conn.execute("SELECT id FROM allocations WHERE status = 'pending'"
                                               " AND desired_state = 'present' ORDER BY random() LIMIT 20")]
        for p in synthetic.first_fit(state, observing.free_slots(conn), pending, seed=rng.randrange(1 << 30),
                                     idle=[r[0] for r in conn.execute(
                                         "SELECT name FROM nodes n WHERE NOT EXISTS (SELECT 1 FROM"
                                         " allocation_resource_claims c WHERE c.node_id = n.id AND c.status IN"
                                         " ('reserved', 'provisioning', 'active', 'releasing'))")]):
            applying.place(conn, p)
        placed = [r[0] for r in conn.execute("SELECT id FROM allocations WHERE status = 'reserved'"
                                              " ORDER BY random() LIMIT 5")]
        for aid in placed:
            applying.release(conn, Release(aid, "", ()))
        # Play the host: verified wipe evidence for every releasing slot claim, then free.
        conn.execute(
            "INSERT INTO host_slot_status (node_name, slot_index, wipe_allocation_id, wipe_state, wipe_evidence,"
            " wipe_reported_at) SELECT n.name, c.slot_index, c.allocation_id, 'verified',"
            " jsonb_build_object('device', c.resource_snapshot -> 'slot' ->> 'nvme_device',"
            " 'signature_clear', true, 'sampled_zero', true), clock_timestamp()"
            " FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
            " WHERE c.status = 'releasing' AND c.claim_kind = 'slot' AND random() < 0.7"
            " ON CONFLICT (node_name, slot_index) DO UPDATE SET wipe_allocation_id = EXCLUDED.wipe_allocation_id,"
            " wipe_state = 'verified', wipe_evidence = EXCLUDED.wipe_evidence,"
            " wipe_reported_at = EXCLUDED.wipe_reported_at")
        cleanup.free_cleaned(conn)
        history.finish(conn, run_id, result="changed")


if __name__ == "__main__":
    apply_forever(sys.argv[1], int(sys.argv[2]))
