"""What the dashboard needs to act: search, the failed and stuck allocations, retries collapsed.

- `search(q, tenant)`: nodes whose name, allocations whose id or tenant, and
  tenants whose name contain `q` (case-insensitive; `%` and `_` are literal);
  `tenant` lists one tenant's allocations exactly. Bounded: at most LIMIT of each.
- `troubled()`: allocations that need an operator, newest first: failed
  (with the failure, attempts and the host's last message), stuck in
  reserved/provisioning for longer than STUCK_AFTER_S, or placed on a host
  that went silent. One query over the allocations that qualify, never a
  scan of every allocation's lifecycle.
- `collapsed(rows)`: runs of reconciliation history rows that say the same
  thing (a retry every 10 s of one failing revision) folded into one row
  with its count and first and last time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.service import allocationreads, readrows
from reconciler.store.connections import Connection

LIMIT = 50
STUCK_AFTER_S = 900  # reserved or provisioning this long: the host has not made it ready


def _pattern(q: str) -> str:
    escaped = q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def search(conn: Connection, q: str | None, tenant: str | None, limit: int = LIMIT) -> dict[str, Any]:
    """Nodes, allocations and tenants matching `q`, and/or one tenant's allocations."""
    like = _pattern(q) if q else None
    nodes: list[dict[str, Any]] = []
    tenants: list[dict[str, Any]] = []
    if like is not None:
        nodes = readrows._rows(
            conn,
            "SELECT name, region, pool, admin_state FROM nodes WHERE present AND name ILIKE %s ORDER BY name LIMIT %s",
            (like, limit),
        )
        tenants = readrows._rows(
            conn,
            "SELECT tenant, count(*) AS allocations,"
            " count(*) FILTER (WHERE status = 'active') AS active,"
            " count(*) FILTER (WHERE status = 'failed') AS failed"
            " FROM allocations WHERE (present OR status <> 'pending') AND tenant ILIKE %s"
            " GROUP BY tenant ORDER BY tenant LIMIT %s",
            (like, limit),
        )
    rows = readrows._rows(
        conn,
        f"SELECT {allocationreads._ALLOCATION_COLUMNS} FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id"  # noqa: S608
        " WHERE (a.present OR a.status <> 'pending')"
        " AND (%(like)s::text IS NULL OR a.id ILIKE %(like)s OR a.tenant ILIKE %(like)s)"
        " AND (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)"
        " ORDER BY a.id LIMIT %(limit)s",
        {"like": like, "tenant": tenant, "limit": limit},
    )
    return {
        "q": q,
        "tenant": tenant,
        "nodes": nodes,
        "tenants": tenants,
        "allocations": [allocationreads._allocation_summary(r) for r in rows],
        "limit": limit,
    }


def troubled(conn: Connection, limit: int = LIMIT, stuck_after_s: int = STUCK_AFTER_S) -> list[dict[str, Any]]:
    """Failed, stuck and host-unreachable allocations (still wanted), with why and what the host said."""
    # Two steps: the few allocations that qualify (filtered, then sorted and cut), then their details. As one
    # query the planner sorts every allocation first: a cost that grows with the fleet, not with the answer.
    silent = [
        r["id"]
        for r in readrows._rows(
            conn,
            "SELECT n.id FROM node_liveness l JOIN nodes n ON n.name = l.node_name WHERE l.liveness = 'unavailable'",
        )
    ]
    picked = [
        r["id"]
        for r in readrows._rows(
            conn,
            """
        SELECT a.id FROM allocations a
        WHERE a.present AND a.desired_state = 'present' AND (
            a.status = 'failed'
            OR (a.status IN ('reserved', 'provisioning')
                AND coalesce(a.placed_at, a.requested_at) < now() - make_interval(secs => %(stuck)s))
            OR (a.status IN ('reserved', 'provisioning', 'active') AND a.node_id = ANY(%(silent)s)))
        ORDER BY a.status = 'failed' DESC, coalesce(a.failed_at, a.placed_at, a.requested_at) DESC, a.id
        LIMIT %(limit)s""",
            {"stuck": stuck_after_s, "silent": silent, "limit": limit},
        )
    ]
    if not picked:
        return []
    rows = readrows._rows(
        conn,
        """
        SELECT a.id, a.tenant, a.sku, a.gpu_count, a.region, a.status, n.name AS node,
               a.failure_code, a.failure_message, a.failed_at, a.placed_at,
               a.node_id = ANY(%(silent)s) AS host_unreachable,
               (SELECT count(*) FROM allocation_attempts t WHERE t.allocation_id = a.id) AS attempts,
               last.code AS attempt_code, last.message AS attempt_message, last.phase AS attempt_phase,
               gpuaas_host_vm(h.details, a.id) -> 'error' ->> 'code' AS host_code,
               gpuaas_host_vm(h.details, a.id) -> 'error' ->> 'message' AS host_message,
               gpuaas_host_vm(h.details, a.id) ->> 'phase' AS host_phase
        FROM allocations a
        LEFT JOIN nodes n ON n.id = a.node_id
        LEFT JOIN host_status h ON h.node_name = n.name
        LEFT JOIN LATERAL (SELECT t.code, t.message, t.phase FROM allocation_attempts t
                           WHERE t.allocation_id = a.id ORDER BY t.attempt DESC LIMIT 1) last ON true
        WHERE a.id = ANY(%(picked)s)""",
        {"silent": silent, "picked": picked},
    )
    order = {aid: i for i, aid in enumerate(picked)}
    rows.sort(key=lambda r: order[r["id"]])
    out = []
    for r in rows:
        kind = "failed" if r["status"] == "failed" else "host unreachable" if r["host_unreachable"] else "stuck"
        reason = (
            f"{r['failure_code']}: {r['failure_message']}"
            if r["failure_code"]
            else f"{r['status']} since {readrows.iso(r['placed_at'])}"
            if kind == "stuck"
            else "host silent past its liveness TTL"
        )
        code, phase, message = (
            (r["host_code"], r["host_phase"], r["host_message"])
            if r["host_code"]
            else (r["attempt_code"], r["attempt_phase"], r["attempt_message"])
        )
        said = f"{code}" + (f" in {phase}" if phase else "") + f": {message}" if code else None
        out.append(
            {
                "id": r["id"],
                "tenant": r["tenant"],
                "request": f"{r['gpu_count']}x {r['sku']} in {r['region']}",
                "status": r["status"],
                "kind": kind,
                "node": r["node"],
                "reason": reason,
                "attempts": int(r["attempts"]),
                "host_message": said,
                "host_phase": r["host_phase"],
                "at": readrows.iso(r["failed_at"] or r["placed_at"]),
            }
        )
    return out


def _key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a history row says: revision, result, source (not the trigger), its first error."""
    return r["revision"], r["result"], r["source"].partition(" ")[2], (r["errors"] or [None])[0]


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return _key(a) == _key(b) and a["result"] != "changed"  # two changes are two events, never a retry


def collapsed(rows: Sequence[Mapping[str, Any]], shown: int = 10) -> list[dict[str, Any]]:
    """History rows (newest first) with runs of the same outcome folded: `repeats` and `first_started_at`."""
    out: list[dict[str, Any]] = []
    for r in rows:
        if out and _same(out[-1], r):
            out[-1]["repeats"] += 1
            out[-1]["first_started_at"] = r["started_at"]
            continue
        if len(out) == shown:
            break
        out.append({**r, "repeats": 1, "first_started_at": r["started_at"]})
    return out
