"""Worker processes for the race and kill tests (importable by multiprocessing's spawn)."""

from __future__ import annotations

import sys
from typing import Any

from psycopg.types.json import Jsonb

from reconciler.plans import Placement


def race(url: str, placements: list[Placement], barrier: Any, results: Any) -> None:
    """Wait for every racer, then place one transaction each; report what happened."""
    from reconciler.store import claims, connections

    conn = connections.connect(url, autocommit=True)
    barrier.wait()
    out = []
    for p in placements:
        r = claims.place(conn, p, max_claim_attempts=1 + len(p.alternatives))
        out.append((p.allocation_id, r.placed, r.node, r.slot_indexes, r.conflicts))
    conn.close()
    results.put(out)


def apply_forever(url: str, seed: int) -> None:
    """Place and release synthetic allocations until killed (the SIGKILL test's victim).

    Everything goes through one connection, for the process's whole life: a
    line `placed <claim kind> <allocation> <backend pid>` is printed each time
    a placement's kind differs from the previous one, so the test can see one
    session place both kinds, one after the other, again and again.
    """
    import random

    from gpuaas_tools.bench import synthetic
    from reconciler.plans import Release
    from reconciler.store import claims, cleanup, connections, history, lifecycle, live
    from tests.claims.test_kill import kill_fleet

    state = kill_fleet()
    rng = random.Random(seed)  # noqa: S311 - test randomness
    conn = connections.connect(url, autocommit=True)
    last_kind = None

    def place(p: Placement) -> None:
        nonlocal last_kind
        if claims.place(conn, p).placed and p.claim_kind is not last_kind:
            last_kind = p.claim_kind
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            print(f"placed {p.claim_kind.value} {p.allocation_id} {row[0] if row else None}", flush=True)

    print("ready", flush=True)
    while True:
        # Each round is a recorded reconciliation: a kill leaves its row running until swept.
        run_id = history.start(conn, revision=f"kill-{seed}", source="kill-test")
        pending = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM allocations a WHERE status = 'pending'"
                " AND desired_state = 'present' AND NOT EXISTS (SELECT 1 FROM"
                " allocation_attempts t WHERE t.allocation_id = a.id)"
                " ORDER BY random() LIMIT 20"
            )
        ]
        idle = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM nodes n WHERE NOT EXISTS (SELECT 1 FROM allocation_resource_claims c"
                " WHERE c.node_id = n.id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'))"
            )
        ]
        free = live.free_slots(conn)
        for p in synthetic.first_fit(state, free, pending, seed=rng.randrange(1 << 30), idle=idle):
            place(p)
        # Rescheduled allocations go anywhere but where they failed (as the planner's `avoid` does).
        for aid, avoid in sorted(lifecycle.avoided_nodes(conn).items())[:5]:
            free = {n: s for n, s in live.free_slots(conn).items() if n not in avoid}
            for p in synthetic.first_fit(
                state, free, [aid], seed=rng.randrange(1 << 30), idle=[n for n in idle if n not in avoid]
            ):
                place(p)
        # Play a host failing some provisions for good (vfio_check), then the reschedule step.
        for aid, node, slots in conn.execute(
            "SELECT c.allocation_id, n.name, array_agg(c.slot_index) FROM allocation_resource_claims c"
            " JOIN nodes n ON n.id = c.node_id JOIN allocations a ON a.id = c.allocation_id"
            " WHERE a.status = 'reserved' AND c.status = 'reserved' AND c.claim_kind = 'slot'"
            " GROUP BY 1, 2 ORDER BY random() LIMIT 2"
        ).fetchall():
            vm = {
                "allocation_id": aid,
                "state": "failed",
                "phase": "vfio_check",
                "error": {"code": "host.pci.not_vfio", "message": "VF not on vfio-pci", "step": "vfio_check"},
            }
            conn.execute(
                "INSERT INTO host_status (node_name, details) VALUES (%s, %s)"
                " ON CONFLICT (node_name) DO UPDATE SET details = jsonb_build_object('vms',"
                " coalesce(host_status.details -> 'vms', '[]') || EXCLUDED.details -> 'vms')",
                (node, Jsonb({"vms": [vm]})),
            )
            for slot in slots:
                conn.execute(
                    "INSERT INTO host_slot_status (node_name, slot_index, allocation_id, vm_state)"
                    " VALUES (%s, %s, %s, 'failed') ON CONFLICT (node_name, slot_index) DO UPDATE SET"
                    " allocation_id = EXCLUDED.allocation_id, vm_state = 'failed'",
                    (node, slot, aid),
                )
        lifecycle.reschedule(conn, max_provision_attempts=3)
        # An operator clears a quarantined slot now and then.
        for node, slot in conn.execute(
            "SELECT n.name, s.slot_index FROM node_resource_slots s JOIN nodes n"
            " ON n.id = s.node_id WHERE s.status = 'quarantined'"
            " ORDER BY random() LIMIT 1"
        ).fetchall():
            lifecycle.clear_quarantine(conn, node, slot)
        placed = [
            r[0] for r in conn.execute("SELECT id FROM allocations WHERE status = 'reserved' ORDER BY random() LIMIT 5")
        ]
        for aid in placed:
            claims.release(conn, Release(aid, "", ()))
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
            " wipe_reported_at = EXCLUDED.wipe_reported_at"
        )
        # ... and verified node cleanup for every releasing baremetal claim, so baremetal nodes
        # come back and a long-lived session keeps switching between the two claim kinds.
        conn.execute(
            "INSERT INTO host_status (node_name, cleanup_allocation_id, cleanup_state, cleanup_reported_at)"
            " SELECT DISTINCT ON (n.name) n.name, c.allocation_id, 'verified', clock_timestamp()"
            " FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
            " WHERE c.status = 'releasing' AND c.claim_kind = 'node_exclusive' AND random() < 0.7"
            " ON CONFLICT (node_name) DO UPDATE SET cleanup_allocation_id = EXCLUDED.cleanup_allocation_id,"
            " cleanup_state = 'verified', cleanup_reported_at = EXCLUDED.cleanup_reported_at"
        )
        cleanup.free_cleaned(conn)
        history.finish(conn, run_id, result="changed")


if __name__ == "__main__":
    apply_forever(sys.argv[1], int(sys.argv[2]))
