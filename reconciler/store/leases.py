"""Baremetal leases as the store keeps them (`baremetal_leases`, migration 0070): rows in, rows out.

A lease row is written before its provider is asked anything (the durable
request); every phase change is one transaction with an outbox event
(`baremetal.<phase>`), which `gpuaas history --allocation` reads. The
provider calls themselves live in `reconciler.reconcile.leasing`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from reconciler.store.connections import Connection
from schemas import dberrors

UNFINISHED = ("deploy_requested", "deploying", "active", "deploy_failed", "release_requested", "erasing")


@dataclass(frozen=True, slots=True)
class Work:
    """A node_exclusive claim on a node a provider serves, with its lease row if one was written."""

    claim_id: str
    allocation_id: str
    claim_status: str
    node: str
    snapshot: dict[str, Any]
    phase: str | None
    wanted: bool = True  # the allocation is declared and desired present (an orphan is never deployed)


@dataclass(frozen=True, slots=True)
class Lease:
    claim_id: str
    allocation_id: str
    node_name: str
    provider: str
    machine_id: str
    phase: str
    wipe_policy: str
    deploy_requests: int
    erase_requests: int
    adopted: int
    provider_state: str | None
    ssh_endpoint: str | None
    wait_code: str | None
    wait_message: str | None


def work(conn: Connection, nodes: Iterable[str]) -> list[Work]:
    """Live or releasing node_exclusive claims on the given nodes, or with a lease row not yet finished."""
    with dberrors.wrapped("read baremetal lease work"):
        rows = conn.execute(
            "SELECT c.id::text, c.allocation_id, c.status::text, n.name, c.resource_snapshot, bl.phase,"
            " a.present AND a.desired_state = 'present'"
            " FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
            " JOIN allocations a ON a.id = c.allocation_id"
            " LEFT JOIN baremetal_leases bl ON bl.claim_id = c.id"
            " WHERE c.claim_kind = 'node_exclusive'"
            " AND ((c.status IN ('reserved', 'provisioning', 'active', 'releasing') AND n.name = ANY(%s))"
            "      OR bl.phase = ANY(%s))"
            " ORDER BY c.allocation_id, c.id",
            (list(nodes), list(UNFINISHED)),
        ).fetchall()
    return [Work(str(i), str(a), str(s), str(n), dict(snap or {}), p, bool(w)) for i, a, s, n, snap, p, w in rows]


def request_deploy(conn: Connection, w: Work, provider: str, machine_id: str, wipe_policy: str) -> bool:
    """The durable deploy request, committed before the provider is called. False: one exists already."""
    with dberrors.wrapped(f"record the deploy request of {w.allocation_id}"), conn.transaction():
        cur = conn.execute(
            "INSERT INTO baremetal_leases (claim_id, allocation_id, node_name, provider, machine_id, phase,"
            " wipe_policy) VALUES (%s, %s, %s, %s, %s, 'deploy_requested', %s) ON CONFLICT (claim_id) DO NOTHING",
            (w.claim_id, w.allocation_id, w.node, provider, machine_id, wipe_policy),
        )
        if cur.rowcount:
            event(
                conn,
                w.allocation_id,
                "deploy_requested",
                {"node": w.node, "provider": provider, "machine_id": machine_id},
            )
    return cur.rowcount > 0


def lock(conn: Connection, claim_id: str) -> Lease | None:
    """The lease row locked for this transaction; None when another reconciler holds it."""
    return (
        conn.cursor(row_factory=class_row(Lease))
        .execute(
            "SELECT claim_id::text, allocation_id, node_name, provider, machine_id, phase, wipe_policy,"
            " deploy_requests, erase_requests, adopted, provider_state, ssh_endpoint, wait_code, wait_message"
            " FROM baremetal_leases WHERE claim_id = %s FOR UPDATE SKIP LOCKED",
            (claim_id,),
        )
        .fetchone()
    )


_TIMES = {
    "deploying": "deploy_sent_at",
    "active": "active_at",
    "deploy_failed": "failed_at",
    "release_requested": "release_requested_at",
    "erasing": "erase_sent_at",
    "erased": "erased_at",
    "erase_failed": "erased_at",
}


def move(
    conn: Connection,
    lease: Lease,
    phase: str,
    *,
    provider_state: str | None = None,
    message: str = "",
    sent: str | None = None,
    adopted: bool = False,
    deployed: bool = False,
    ssh_endpoint: str | None = None,
    evidence: dict[str, Any] | None = None,
) -> None:
    """One phase change (inside the caller's transaction), with its outbox event."""
    column = _TIMES.get(phase)
    # `column` comes from _TIMES, never from input.
    conn.execute(
        "UPDATE baremetal_leases SET phase = %s, provider_state = coalesce(%s, provider_state),"  # noqa: S608
        " provider_message = %s, deploy_requests = deploy_requests + %s, erase_requests = erase_requests + %s,"
        " adopted = adopted + %s, deployed_at = CASE WHEN %s THEN coalesce(deployed_at, now()) ELSE deployed_at END,"
        " ssh_endpoint = coalesce(%s, ssh_endpoint), erase_evidence = coalesce(%s, erase_evidence),"
        " wait_code = NULL, wait_message = NULL, waiting_since = NULL, updated_at = now()"
        + (f", {column} = coalesce({column}, now())" if column else "")
        + " WHERE claim_id = %s",
        (
            phase,
            provider_state,
            message or None,
            int(sent == "deploy"),
            int(sent == "erase"),
            int(adopted),
            deployed,
            ssh_endpoint,
            Jsonb(evidence) if evidence is not None else None,
            lease.claim_id,
        ),
    )
    details: dict[str, Any] = {
        "node": lease.node_name,
        "provider": lease.provider,
        "machine_id": lease.machine_id,
        "provider_state": provider_state,
    }
    if message:
        details["message"] = message
    if adopted:
        details["adopted"] = True
    if evidence is not None:
        details["evidence"] = evidence
    event(conn, lease.allocation_id, phase, details)


def note(
    conn: Connection,
    lease: Lease,
    *,
    provider_state: str | None = None,
    deployed: bool = False,
    ssh_endpoint: str | None = None,
) -> None:
    """What the provider said, without a phase change (written only when it differs)."""
    conn.execute(
        "UPDATE baremetal_leases SET provider_state = coalesce(%s, provider_state),"
        " deployed_at = CASE WHEN %s THEN coalesce(deployed_at, now()) ELSE deployed_at END,"
        " ssh_endpoint = coalesce(%s, ssh_endpoint), updated_at = now()"
        " WHERE claim_id = %s AND (provider_state IS DISTINCT FROM coalesce(%s, provider_state)"
        "  OR (%s AND deployed_at IS NULL) OR ssh_endpoint IS DISTINCT FROM coalesce(%s, ssh_endpoint))",
        (provider_state, deployed, ssh_endpoint, lease.claim_id, provider_state, deployed, ssh_endpoint),
    )


def wait(conn: Connection, claim_id: str, code: str, message: str) -> None:
    """Why the lease is not moving (provider unreachable, SSH not answering, ...); written only on change."""
    with dberrors.wrapped("record why a lease waits"):
        conn.execute(
            "UPDATE baremetal_leases SET wait_code = %s, wait_message = %s,"
            " waiting_since = CASE WHEN wait_code IS DISTINCT FROM %s THEN now() ELSE waiting_since END,"
            " updated_at = now() WHERE claim_id = %s AND (wait_code, wait_message) IS DISTINCT FROM (%s, %s)",
            (code, message[:1000], code, claim_id, code, message[:1000]),
        )


def event(conn: Connection, allocation_id: str, phase: str, payload: dict[str, Any]) -> None:
    conn.execute(
        "INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload) VALUES (%s, 'allocation', %s, %s)",
        (f"baremetal.{phase}", allocation_id, Jsonb({"allocation_id": allocation_id, "phase": phase, **payload})),
    )


def quarantine(conn: Connection, lease: Lease, code: str, message: str) -> None:
    conn.execute(
        "INSERT INTO machine_quarantine (node_name, provider, machine_id, allocation_id, code, message)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (node_name) DO NOTHING",
        (lease.node_name, lease.provider, lease.machine_id, lease.allocation_id, code, message[:4096]),
    )


def owe_slice_profile(conn: Connection, node: str, allocation_id: str) -> None:
    conn.execute(
        "INSERT INTO node_profile_debts (node_name, allocation_id) VALUES (%s, %s)"
        " ON CONFLICT (node_name) DO UPDATE SET allocation_id = EXCLUDED.allocation_id, since = now()",
        (node, allocation_id),
    )


def settle_profile_debts(conn: Connection) -> int:
    """A debt is paid when the node's host agent reports after the last erase and no lease is unfinished."""
    with dberrors.wrapped("settle slice profile debts"):
        cur = conn.execute(
            "DELETE FROM node_profile_debts d USING host_status h WHERE h.node_name = d.node_name"
            " AND h.reported_at > d.since AND h.firmware_ready IS NOT FALSE"
            " AND NOT EXISTS (SELECT 1 FROM baremetal_leases bl WHERE bl.node_name = d.node_name"
            "                 AND (bl.phase <> 'erased' OR bl.erased_at >= h.reported_at))"
        )
    return cur.rowcount


def absorb(conn: Connection) -> int:
    with dberrors.wrapped("absorb baremetal leases"), conn.transaction():
        row = conn.execute("SELECT gpuaas_absorb_leases()").fetchone()
    return int(row[0]) if row else 0


def replace_drift(conn: Connection, provider: str, found: list[tuple[str, str | None, str, str]]) -> None:
    """The provider's drift as of this scan: (machine_id, node, code, message) rows."""
    with dberrors.wrapped(f"record drift of {provider}"), conn.transaction():
        conn.execute("DELETE FROM machine_drift WHERE provider = %s", (provider,))
        for mid, node, code, message in found:
            conn.execute(
                "INSERT INTO machine_drift (provider, machine_id, node_name, code, message)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                (provider, mid, node, code, message),
            )


def details(conn: Connection, allocation_ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """The latest lease of each allocation (all, or those named), for status, the API and the dashboard."""
    ids = None if allocation_ids is None else list(allocation_ids)
    with dberrors.wrapped("read baremetal leases"):
        rows = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT DISTINCT ON (allocation_id) allocation_id, node_name AS node, provider, machine_id, phase,"
                " wipe_policy, provider_state, provider_message, ssh_endpoint, wait_code, wait_message, waiting_since,"
                " deploy_requested_at, deploy_sent_at, deployed_at, active_at, failed_at, release_requested_at,"
                " erase_sent_at, erased_at, deploy_requests, erase_requests, adopted, erase_evidence"
                " FROM baremetal_leases WHERE (%s::text[] IS NULL OR allocation_id = ANY(%s::text[]))"
                " ORDER BY allocation_id, deploy_requested_at DESC",
                (ids, ids),
            )
            .fetchall()
        )
    return {str(r["allocation_id"]): _timed(r) for r in rows}


def _timed(r: dict[str, Any]) -> dict[str, Any]:
    out = dict(r)
    out["timings_s"] = {
        "deploy": _span(r["deploy_requested_at"], r["deployed_at"]),
        "ssh": _span(r["deployed_at"], r["active_at"]),
        "to_active": _span(r["deploy_requested_at"], r["active_at"]),
        "erase": _span(r["release_requested_at"], r["erased_at"]),
    }
    return out


def _span(a: dt.datetime | None, b: dt.datetime | None) -> float | None:
    return round((b - a).total_seconds(), 3) if a is not None and b is not None else None


def node_states(conn: Connection) -> dict[str, dict[str, Any]]:
    """Per node: the unfinished lease (leased / erase_failed), quarantine and profile debt, for the dashboard."""
    out: dict[str, dict[str, Any]] = {}
    with dberrors.wrapped("read leased nodes"):
        for node, aid, phase in conn.execute(
            "SELECT node_name, allocation_id, phase FROM baremetal_leases WHERE phase <> 'erased'"
        ).fetchall():
            out.setdefault(str(node), {})["lease"] = {"allocation_id": aid, "phase": phase}
        for node, code, message in conn.execute("SELECT node_name, code, message FROM machine_quarantine").fetchall():
            out.setdefault(str(node), {})["quarantine"] = {"code": code, "message": message}
        for (node,) in conn.execute("SELECT node_name FROM node_profile_debts").fetchall():
            out.setdefault(str(node), {})["needs_slice_profile"] = True
    return out


def drift(conn: Connection) -> list[dict[str, Any]]:
    with dberrors.wrapped("read machine drift"):
        return [
            dict(r)
            for r in conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT provider, machine_id, node_name AS node, code, message, seen_at FROM machine_drift"
                " ORDER BY provider, machine_id"
            )
            .fetchall()
        ]


def blocked_nodes(conn: Connection, among: Collection[str] | None = None) -> frozenset[str]:
    """Nodes no placement may use: a machine quarantined after a failed deploy (`among`: only these)."""
    return _nodes_in(conn, "machine_quarantine", among, "read quarantined machines")


def profile_debts(conn: Connection, among: Collection[str] | None = None) -> frozenset[str]:
    return _nodes_in(conn, "node_profile_debts", among, "read slice profile debts")


def _nodes_in(conn: Connection, table: str, among: Collection[str] | None, doing: str) -> frozenset[str]:
    sql = f"SELECT node_name FROM {table}"  # noqa: S608 (a constant table name)
    with dberrors.wrapped(doing):
        if among is None:
            rows = conn.execute(sql).fetchall()
        else:
            rows = conn.execute(sql + " WHERE node_name = ANY(%s)", (sorted(among),)).fetchall()
    return frozenset(str(r[0]) for r in rows)


def summary(conn: Connection) -> dict[str, dict[str, int]]:
    """Counts for /metrics: leases by phase, waiting leases by code, quarantined machines, drift by code."""
    with dberrors.wrapped("count baremetal leases"):
        phases = conn.execute("SELECT phase, count(*) FROM baremetal_leases GROUP BY phase").fetchall()
        waiting = conn.execute(
            "SELECT wait_code, count(*) FROM baremetal_leases WHERE wait_code IS NOT NULL"
            " AND phase <> 'erased' GROUP BY wait_code"
        ).fetchall()
        quarantined = conn.execute("SELECT count(*) FROM machine_quarantine").fetchone()
        drifted = conn.execute("SELECT code, count(*) FROM machine_drift GROUP BY code").fetchall()
    return {
        "phases": {str(p): int(n) for p, n in phases},
        "waiting": {str(c): int(n) for c, n in waiting},
        "quarantined": {"machines": int(quarantined[0]) if quarantined else 0},
        "drift": {str(c): int(n) for c, n in drifted},
    }


def clear_quarantine(conn: Connection, node: str) -> dict[str, Any] | None:
    """An operator's decision: the machine takes placements again. Returns what was cleared (None: nothing)."""
    with dberrors.wrapped(f"clear the quarantine of {node}"), conn.transaction():
        row = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "DELETE FROM machine_quarantine WHERE node_name = %s"
                " RETURNING provider, machine_id, allocation_id, code, message, quarantined_at",
                (node,),
            )
            .fetchone()
        )
        if row is not None:
            event(
                conn,
                str(row["allocation_id"]),
                "quarantine_cleared",
                {"node": node, "provider": row["provider"], "machine_id": row["machine_id"]},
            )
    return dict(row) if row is not None else None
