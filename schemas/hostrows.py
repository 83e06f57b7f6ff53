"""The rows of one host report: `host_status`, `host_slot_status`, `node_image_cache`, and the heartbeat.

One mirror from the report document (`HostStatus.as_dict()`, the agent API's
wire form: schemas/agentwire.py) to rows, shared by the two writers: the
service's agent API (reconciler/service/agents.py, as the node's identity
for the transaction) and the host agent's direct-database lab mode
(host_reconciler/hostdb.py, as the node's own role). Row-level security fences
either to the node's rows; migration 0008 refuses a report of the wrong shape.

A report older than the one stored (a lower `observed_generation`: a
delayed retry, a queued report sent after a newer one) is ignored whole:
`write_status` returns False and writes nothing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from schemas import dberrors

# The node row moves only forward: an older generation than stored is not written (and RETURNING says so).
_STATUS_SQL = """
INSERT INTO host_status AS h (node_name, observed_generation, reported_at, healthy, firmware_ready,
                              phase_timings, drift, errors, details)
VALUES (%(node)s, %(gen)s, now(), %(healthy)s, %(firmware)s, %(timings)s, %(drift)s, %(errors)s, %(details)s)
ON CONFLICT (node_name) DO UPDATE SET
    observed_generation = EXCLUDED.observed_generation, reported_at = now(),
    healthy = EXCLUDED.healthy, firmware_ready = EXCLUDED.firmware_ready, phase_timings = EXCLUDED.phase_timings,
    drift = EXCLUDED.drift, errors = EXCLUDED.errors, details = EXCLUDED.details
WHERE h.observed_generation <= EXCLUDED.observed_generation
RETURNING node_name
"""

# wipe_reported_at moves only when the wipe report itself changes, so it says
# when the evidence was first reported (claim_cleanup_proven compares it with
# the release request).
_SLOT_SQL = """
INSERT INTO host_slot_status AS h (node_name, slot_index, observed_generation, allocation_id,
    vm_state, vm_ready_at, wipe_allocation_id, wipe_state, wipe_evidence, wipe_error,
    wipe_reported_at, phase_timings, drift, updated_at)
VALUES (%(node)s, %(slot)s, %(gen)s, %(alloc)s, %(vm_state)s, %(ready_at)s::timestamptz,
    %(wipe_alloc)s, %(wipe_state)s, %(evidence)s, %(wipe_error)s,
    CASE WHEN %(wipe_state)s::text IS NULL THEN NULL ELSE now() END, %(timings)s, %(drift)s, now())
ON CONFLICT (node_name, slot_index) DO UPDATE SET
    observed_generation = EXCLUDED.observed_generation, allocation_id = EXCLUDED.allocation_id,
    vm_state = EXCLUDED.vm_state, vm_ready_at = EXCLUDED.vm_ready_at,
    wipe_allocation_id = EXCLUDED.wipe_allocation_id, wipe_state = EXCLUDED.wipe_state,
    wipe_evidence = EXCLUDED.wipe_evidence, wipe_error = EXCLUDED.wipe_error,
    wipe_reported_at = CASE
        WHEN EXCLUDED.wipe_state IS NULL THEN NULL
        WHEN h.wipe_state IS DISTINCT FROM EXCLUDED.wipe_state
          OR h.wipe_allocation_id IS DISTINCT FROM EXCLUDED.wipe_allocation_id
          OR h.wipe_evidence IS DISTINCT FROM EXCLUDED.wipe_evidence THEN now()
        ELSE h.wipe_reported_at END,
    phase_timings = EXCLUDED.phase_timings, drift = EXCLUDED.drift, updated_at = now()
"""

DETAIL_KEYS = ("generation", "mode", "converged", "pending", "vms", "pass_ms", "reported_at", "images", "host")


def write_status(conn: psycopg.Connection[Any], doc: Mapping[str, Any]) -> bool:
    """Write the node row, every slot row and the image cache of one report in one transaction.

    False: the stored report is newer (higher observed generation); nothing was written.
    """
    node = str(doc["node"])
    gen = int(doc["observed_generation"])
    details = {k: doc.get(k) for k in DETAIL_KEYS}
    timings = {v["allocation_id"]: v.get("phase_timings") or {} for v in doc.get("vms") or ()}
    host = doc.get("host") or {}
    with dberrors.wrapped(f"write the host status of {node}"), conn.transaction():
        row = conn.execute(
            _STATUS_SQL,
            {
                "node": node,
                "gen": gen,
                "healthy": doc.get("healthy"),
                # the host's firmware evidence (None: no evidence, the git onboarding claim stands)
                "firmware": host.get("firmware_ready") if isinstance(host, Mapping) else None,
                "timings": Jsonb(timings),
                "drift": Jsonb(doc.get("drift") or []),
                "errors": Jsonb(doc.get("errors") or []),
                "details": Jsonb(details),
            },
        ).fetchone()
        if row is None:
            return False
        for s in doc.get("slots") or ():
            conn.execute(
                _SLOT_SQL,
                {
                    "node": node,
                    "slot": s["slot_index"],
                    "gen": gen,
                    "alloc": s.get("allocation_id"),
                    "vm_state": s.get("vm_state"),
                    "ready_at": s.get("vm_ready_at"),
                    "wipe_alloc": s.get("wipe_allocation_id"),
                    "wipe_state": s.get("wipe_state"),
                    "evidence": Jsonb(s.get("wipe_evidence") or {}),
                    "wipe_error": s.get("wipe_error"),
                    "timings": Jsonb(s.get("phase_timings") or {}),
                    "drift": Jsonb([{**d, "state": s.get("state")} for d in s.get("drift") or ()]),
                },
            )
        write_image_cache(conn, node, ((doc.get("images") or {}).get("cached") or ()))
        write_telemetry(conn, node, doc.get("telemetry") or {})
    return True


def write_telemetry(conn: psycopg.Connection[Any], node: str, samples: Mapping[str, Mapping[str, Any]]) -> None:
    """The newest guest GPU sample per allocation (0056): one more report kind of the status."""
    for alloc, sample in samples.items():
        received = dt.datetime.fromtimestamp(float(sample.get("received_at") or 0), dt.UTC)
        body = {k: v for k, v in sample.items() if k != "received_at"}
        conn.execute(
            """INSERT INTO allocation_telemetry (allocation_id, node_name, received_at, sample)
               VALUES (%s, %s, %s, %s)
               ON CONFLICT (allocation_id, node_name) DO UPDATE SET
                   received_at = EXCLUDED.received_at, sample = EXCLUDED.sample, reported_at = now()
               WHERE allocation_telemetry.received_at < EXCLUDED.received_at""",
            (alloc, node, received, Jsonb(body)),
        )


def write_image_cache(conn: psycopg.Connection[Any], node: str, cached: Sequence[Mapping[str, Any]]) -> None:
    """Replace the node's `node_image_cache` rows (0052) with what its cache holds now."""
    rows = [(node, str(e["digest"]).removeprefix("sha256:"), int(e["size_bytes"]), e["last_used"]) for e in cached]
    conn.execute(
        "DELETE FROM node_image_cache WHERE node_name = %s AND NOT (digest_sha256 = ANY(%s))",
        (node, [r[1] for r in rows]),
    )
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO node_image_cache (node_name, digest_sha256, size_bytes, last_used_at)
                   VALUES (%s, %s, %s, %s::timestamptz)
                   ON CONFLICT (node_name, digest_sha256) DO UPDATE SET size_bytes = EXCLUDED.size_bytes,
                       last_used_at = EXCLUDED.last_used_at, reported_at = now()""",
                rows,
            )


def heartbeat(conn: psycopg.Connection[Any], nodes: Sequence[str]) -> None:
    """Say these host agents are alive (host_status.reported_at = now), without touching their last report.

    One statement for any number of nodes: the service writes the heartbeats it
    received in the last second as one batch. The central reconciler marks a
    node unavailable when reported_at is older than the fleet's
    `host_liveness_ttl_seconds` (view node_liveness, 0011).
    """
    with dberrors.wrapped(f"heartbeat of {len(nodes)} node(s)"):
        conn.execute(
            "INSERT INTO host_status (node_name, reported_at) SELECT n, now() FROM unnest(%s::text[]) n"
            " ORDER BY n ON CONFLICT (node_name) DO UPDATE SET reported_at = now()",
            (list(nodes),),
        )
