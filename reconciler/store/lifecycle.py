"""The allocation lifecycle, reschedules, quarantined slots and host liveness.

One lifecycle per allocation, kept in PostgreSQL and fed by host reports
(view `allocation_lifecycle`, migration 0011):

    pending -> reserved -> provisioning (host phase) -> ready -> releasing -> cleanup -> released
                                     \\-> failed (code + every attempt's reason)

A permanent provision failure the host reports (a slot `failed`, a baremetal
lease `failed`, or a readiness timeout) is one transaction
(`gpuaas_reschedule`): the attempt is recorded with its evidence, the
attempt's claims are released through cleanup (the host stops, wipes and
verifies as for any release), and the allocation is pending again, placed
by the next plan on another node (never one where it failed: the planner is
told, and the claims guard refuses it), until `Fleet.max_provision_attempts` attempts
failed; then it is `failed` with the reason chain. A failure whose code
implicates the node (`RESCHEDULE_PATTERNS`) also quarantines the slots: the
cleanup proof leaves them `quarantined` instead of available, until an
operator clears them (`gpuaas slot clear NODE SLOT`, or a commit that changes
the slot). Any other permanent failure (a bad SSH key, a plan the host
cannot decode) would fail the same everywhere: the allocation fails at once.

Liveness: a node whose host reported once and then stayed silent longer
than `Fleet.host_liveness_ttl_seconds` is unavailable (view `node_liveness`):
the planner places nothing new on it, its allocations show `host_unreachable`
and nothing is released (a silent host may still run tenant VMs); its next
report brings it back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from desired import defaults
from desired.state import DesiredState
from reconciler import codes as reconciler_codes
from reconciler.store.connections import Connection
from schemas import dberrors

# Host error codes (SQL LIKE patterns) that implicate the node: the slots are
# quarantined and the allocation is placed again elsewhere.
RESCHEDULE_PATTERNS: tuple[str, ...] = (
    "host.pci.%",  # a GPU or VF not on vfio-pci, missing, or failing to bind
    "host.image.digest_mismatch",  # the node's cached image is not the catalog's
    "host.disk.%",  # the disk guard refused the slot's disk (mounted, OS disk, identity, ...)
    "host.readiness.%",  # no DHCP lease or no TCP answer before the readiness timeout
    "host.kvm_missing",
    "host.hugepages.%",
    "baremetal.deploy.%",  # a machine provider's failed deploy (the machine is quarantined)
)


@dataclass(frozen=True, slots=True)
class Rescheduled:
    allocation_id: str
    outcome: str  # rescheduled | failed | busy | unchanged
    node: str | None
    attempt: int | None
    code: str | None
    message: str | None


@dataclass(frozen=True, slots=True)
class Liveness:
    node: str
    liveness: str  # live | unavailable | disrupted (silent in a disrupted region: not marked) | unknown
    reported_at: dt.datetime | None
    silent_s: float | None
    ttl_s: int

    @property
    def reason(self) -> str | None:
        if self.liveness != "unavailable":
            return None
        return (
            f"host.silent: no report for {self.silent_s:.0f} s (TTL {self.ttl_s} s, "
            f"last {self.reported_at.isoformat(timespec='seconds') if self.reported_at else '-'})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.liveness,
            "reported_at": self.reported_at,
            "silent_s": self.silent_s,
            "ttl_s": self.ttl_s,
            "reason": self.reason,
        }


def fleet_settings(state: DesiredState) -> tuple[int, int]:
    """(liveness TTL seconds, max provision attempts) of the desired state's Fleet."""
    fleet = state.fleet
    if fleet is None:
        return defaults.HOST_LIVENESS_TTL_S, defaults.PROVISION_ATTEMPTS
    return fleet.host_liveness_ttl_seconds, fleet.max_provision_attempts


def sync_settings(conn: Connection, state: DesiredState) -> bool:
    """Store the Fleet's lifecycle settings (written only when they change); True when written."""
    ttl, attempts = fleet_settings(state)
    with dberrors.wrapped("store the lifecycle settings"):
        cur = conn.execute(
            "UPDATE fleet_settings SET host_liveness_ttl_s = %s, max_provision_attempts = %s"
            " WHERE (host_liveness_ttl_s, max_provision_attempts) IS DISTINCT FROM (%s, %s)",
            (ttl, attempts, ttl, attempts),
        )
    return cur.rowcount > 0


def reschedule(
    conn: Connection, *, max_provision_attempts: int, patterns: Iterable[str] = RESCHEDULE_PATTERNS
) -> tuple[Rescheduled, ...]:
    """Act on every permanent provision failure the hosts reported: one transaction per allocation."""
    pats = list(patterns)
    with dberrors.wrapped("find failed provisions"):
        ids = [
            str(r[0])
            for r in conn.execute(
                "SELECT DISTINCT allocation_id FROM gpuaas_provision_failures(%s) ORDER BY 1", (pats,)
            ).fetchall()
        ]
    out = []
    for aid in ids:
        with dberrors.wrapped(f"reschedule {aid}"), conn.transaction():
            row = conn.execute(
                "SELECT outcome, node, attempt, code, message FROM gpuaas_reschedule(%s, %s, %s)",
                (aid, max_provision_attempts, pats),
            ).fetchone()
        if row is not None:
            out.append(Rescheduled(aid, str(row[0]), row[1], row[2], row[3], row[4]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Cleared:
    node: str
    slot_index: int
    outcome: str  # cleared | not_quarantined | unknown
    status: str | None
    evidence: dict[str, Any] | None


def clear_quarantine(conn: Connection, node: str, slot_index: int) -> Cleared:
    """An operator's decision: the slot returns to service (available, or disabled if git no longer offers it)."""
    with dberrors.wrapped(f"clear the quarantine of {node}:{slot_index}"), conn.transaction():
        row = conn.execute(
            "SELECT outcome, status, evidence FROM gpuaas_clear_quarantine(%s, %s)", (node, slot_index)
        ).fetchone()
    if row is None:
        return Cleared(node, slot_index, "unknown", None, None)
    return Cleared(node, slot_index, str(row[0]), row[1], row[2])


def liveness(conn: Connection) -> dict[str, Liveness]:
    """Every present node's liveness (`unknown` for a node whose host never reported)."""
    with dberrors.wrapped("read node liveness"):
        rows = conn.execute(
            "SELECT node_name, liveness, reported_at, silent_s, ttl_s FROM node_liveness ORDER BY node_name"
        ).fetchall()
    return {
        str(n): Liveness(str(n), str(state), at, float(s) if s is not None else None, int(ttl))
        for n, state, at, s, ttl in rows
    }


def silent_nodes(conn: Connection) -> frozenset[str]:
    """`node_liveness` (0061)'s unavailable nodes, read per commit from the silent reports out (the view
    scans every node): a region's reported hosts are counted only where more than two are silent."""
    with dberrors.wrapped("read silent nodes"):
        rows = conn.execute(
            "WITH f AS (SELECT coalesce((SELECT host_liveness_ttl_s FROM fleet_settings), 90) AS ttl,"
            "   coalesce((SELECT zone_disruption_fraction FROM fleet_settings), 0.55) AS fraction),"
            # From the silent reports out: the cut-off is one value (not an interval per report), and each
            # silent host's node is looked up by name (LIMIT 1 keeps the planner from joining every node
            # by hash: 46 ms a commit at 100,000 nodes, whatever the reports).
            " s AS (SELECT h.node_name, n.region FROM host_status h"
            "   CROSS JOIN LATERAL (SELECT n.region FROM nodes n WHERE n.name = h.node_name AND n.present LIMIT 1) n"
            "   WHERE h.reported_at < (SELECT now() - make_interval(secs => f.ttl) FROM f)),"
            " d AS (SELECT s.region FROM s CROSS JOIN f GROUP BY s.region, f.fraction"
            "   HAVING count(*) > 2 AND count(*) > f.fraction * (SELECT count(*) FROM host_status h"
            "     JOIN nodes n ON n.name = h.node_name WHERE n.present AND n.region = s.region))"
            " SELECT node_name FROM s WHERE region NOT IN (SELECT region FROM d)"
        ).fetchall()
    return frozenset(str(r[0]) for r in rows)


def lifecycles(conn: Connection, allocation_ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """The lifecycle of each allocation (all, or the ones named), with its failed attempts."""
    ids = None if allocation_ids is None else list(allocation_ids)
    every = ids is None  # bound, not spliced: one query text for both cases
    with dberrors.wrapped("read allocation lifecycles"):
        rows = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT * FROM allocation_lifecycle WHERE %(every)s OR allocation_id = ANY(%(ids)s)"
                " ORDER BY allocation_id",
                {"every": every, "ids": ids or []},
            )
            .fetchall()
        )
        tries = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT allocation_id, attempt, node, slot_indexes, phase, code, message, quarantined, outcome,"
                " failed_at FROM allocation_attempts WHERE %(every)s OR allocation_id = ANY(%(ids)s)"
                " ORDER BY allocation_id, attempt",
                {"every": every, "ids": ids or []},
            )
            .fetchall()
        )
    attempts: dict[str, list[dict[str, Any]]] = {}
    for t in tries:
        aid = t.pop("allocation_id")
        attempts.setdefault(aid, []).append(t)
    out = {}
    for r in rows:
        aid = r.pop("allocation_id")
        r["attempts"] = attempts.get(aid, [])
        out[aid] = r
    return out


def avoided_nodes(conn: Connection, ids: Collection[str] | None = None) -> dict[str, frozenset[str]]:
    """Per pending allocation, the nodes where an earlier attempt failed (the planner avoids them).

    `ids`: only these allocations (None: all)."""
    among = "" if ids is None else " AND t.allocation_id = ANY(%(ids)s)"
    with dberrors.wrapped("read failed attempts"):
        rows = conn.execute(
            "SELECT t.allocation_id, array_agg(DISTINCT t.node) FROM allocation_attempts t"  # noqa: S608 (constant)
            " JOIN allocations a ON a.id = t.allocation_id WHERE a.status = 'pending'"
            + among
            + " GROUP BY t.allocation_id",
            {} if ids is None else {"ids": sorted(ids)},
        ).fetchall()
    return {str(a): frozenset(str(n) for n in nodes) for a, nodes in rows}


def retired_label(allocation_id: str, attempt: int) -> str:
    """How the planner sees a failed attempt's claims (still releasing): not the allocation's placement."""
    return f"{allocation_id}@attempt-{attempt}"


def health_reasons(conn: Connection) -> dict[str, list[dict[str, Any]]]:
    """Why each node is unavailable or unhealthy: the failing check and its evidence (empty: nothing wrong).

    A silent host (`host.silent`, with its last report and the TTL), and a
    host that reported itself unhealthy: its network findings (what
    `healthy = false` is computed from) or, failing those, its dberrors.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    for node, live in liveness(conn).items():
        if live.reason is not None:
            out.setdefault(node, []).append(
                {
                    "code": reconciler_codes.HOST_SILENT,
                    "message": live.reason,
                    "evidence": {"reported_at": live.reported_at, "silent_s": live.silent_s, "ttl_s": live.ttl_s},
                }
            )
    with dberrors.wrapped("read host health"):
        rows = conn.execute(
            "SELECT node_name, drift, errors FROM host_status WHERE healthy = false ORDER BY node_name"
        ).fetchall()
    for node, drift, errs in rows:
        found = [
            _finding(d)
            for d in (drift if isinstance(drift, list) else [])
            if isinstance(d, dict) and str(d.get("code", "")).startswith("drift.network.")
        ]
        if not found:
            found = [_finding(e) for e in (errs if isinstance(errs, list) else []) if isinstance(e, dict)][:3]
        out.setdefault(str(node), []).extend(
            found
            or [
                {
                    "code": reconciler_codes.HOST_UNHEALTHY,
                    "message": "the host reported itself unhealthy without a finding",
                    "evidence": {},
                }
            ]
        )
    return out


def _finding(d: dict[str, Any]) -> dict[str, Any]:
    evidence = {
        k: d[k] for k in ("expected", "observed", "subject", "step", "allocation_id") if isinstance(d.get(k), str)
    }
    return {"code": str(d.get("code", ""))[:128], "message": str(d.get("message", ""))[:4096], "evidence": evidence}


def disruption(conn: Connection) -> list[dict[str, Any]]:
    """Each region's silence (migration 0061): a disrupted region's silent nodes are not marked unavailable."""
    with dberrors.wrapped("read region disruption"):
        rows = conn.execute("SELECT region, nodes, silent, disrupted FROM region_disruption ORDER BY region").fetchall()
    return [{"region": r[0], "nodes": int(r[1]), "silent": int(r[2]), "disrupted": bool(r[3])} for r in rows]


def summary(conn: Connection) -> dict[str, Any]:
    """Counts for /metrics: nodes by liveness, allocations flagged host_unreachable, quarantined slots, attempts."""
    with dberrors.wrapped("read lifecycle counts"):
        live: dict[str, int] = dict(conn.execute("SELECT liveness, count(*) FROM node_liveness GROUP BY 1").fetchall())
        unreachable = conn.execute("SELECT count(*) FROM allocation_lifecycle WHERE host_unreachable").fetchone()
        quarantined = conn.execute(
            "SELECT count(*) FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE n.present AND s.quarantine IS NOT NULL"
        ).fetchone()
        attempts: dict[str, int] = dict(
            conn.execute("SELECT outcome, count(*) FROM allocation_attempts GROUP BY 1").fetchall()
        )
    return {
        "nodes_by_liveness": {str(k): int(v) for k, v in live.items()},
        "regions": disruption(conn),
        "allocations_host_unreachable": int(unreachable[0]) if unreachable else 0,
        "slots_quarantined": int(quarantined[0]) if quarantined else 0,
        "failed_attempts": {str(k): int(v) for k, v in attempts.items()},
    }


# ------------------------------------------------------------------ transitions


@dataclass(frozen=True, slots=True)
class Transition:
    """One step of an allocation's recorded lifecycle (`gpuaas history --allocation ID`)."""

    at: dt.datetime
    event: str  # requested | placed | ready | attempt_failed | release_requested | cleanup_proven | released | waiting
    state: str  # the allocation's state after the step
    node: str | None = None
    attempt: int | None = None
    code: str | None = None
    message: str | None = None
    details: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "event": self.event,
            "state": self.state,
            "node": self.node,
            "attempt": self.attempt,
            "code": self.code,
            "message": self.message,
            "details": self.details or {},
        }


def transitions(conn: Connection, allocation_id: str) -> list[Transition] | None:
    """The allocation's state changes and attempts, oldest first, from what the store keeps (None: unknown id).

    The outbox is the durable record (placement, failed attempt, release,
    released: each written in the transaction that made the change); the
    claims add when an attempt became ready and when its cleanup was proven.
    """
    with dberrors.wrapped(f"read the lifecycle of {allocation_id}"):
        alloc = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT requested_at, status, pending_code, pending_message, pending_since FROM allocations"
                " WHERE id = %s",
                (allocation_id,),
            )
            .fetchone()
        )
        if alloc is None:
            return None
        events = conn.execute(
            "SELECT event_type, payload, created_at FROM outbox"
            " WHERE aggregate_type = 'allocation' AND aggregate_id = %s ORDER BY id",
            (allocation_id,),
        ).fetchall()
        claims = conn.execute(
            "SELECT c.id::text, c.active_at, c.released_at FROM allocation_resource_claims c"
            " WHERE c.allocation_id = %s",
            (allocation_id,),
        ).fetchall()
    return timeline(alloc, [(str(t), p, at) for t, p, at in events], {str(i): (a, r) for i, a, r in claims})


ClaimTimes = tuple[dt.datetime | None, dt.datetime | None]  # (active_at, released_at) of one claim


def timeline(
    alloc: dict[str, Any], events: list[tuple[str, dict[str, Any], dt.datetime]], claims: dict[str, ClaimTimes]
) -> list[Transition]:
    """Pure: the allocation row, its outbox events in order and its claims' times -> the transitions, by time."""
    out = [Transition(alloc["requested_at"], "requested", "pending")]
    attempt = 1
    for kind, p, at in events:
        node = p.get("node")
        if kind == "provisioning.requested":
            slots = list(p.get("slot_indexes") or [])
            out.append(
                Transition(
                    at,
                    "placed",
                    "reserved",
                    node,
                    attempt,
                    details={"slot_indexes": slots, "claim_kind": p.get("claim_kind"), "revision": p.get("revision")},
                )
            )
            times = [claims[c] for c in p.get("claim_ids") or [] if c in claims]
            if times and all(a is not None for a, _ in times):
                out.append(Transition(max(a for a, _ in times if a is not None), "ready", "ready", node, attempt))
            if times and all(r is not None for _, r in times):
                out.append(
                    Transition(
                        max(r for _, r in times if r is not None),
                        "cleanup_proven",
                        "cleanup",
                        node,
                        attempt,
                        details={"slot_indexes": slots},
                    )
                )
        elif kind == "provisioning.failed":
            again = p.get("next") == "reschedule"
            out.append(
                Transition(
                    at,
                    "attempt_failed",
                    "pending" if again else "failed",
                    node,
                    p.get("attempt"),
                    p.get("code"),
                    p.get("message"),
                    details={
                        "phase": p.get("phase"),
                        "slot_indexes": list(p.get("slot_indexes") or []),
                        "quarantined": bool(p.get("quarantined")),
                        "next": "reschedule" if again else "failed",
                    },
                )
            )
            attempt = int(p.get("attempt") or attempt) + 1
        elif kind == "release.requested":
            out.append(
                Transition(
                    at,
                    "release_requested",
                    "releasing",
                    node,
                    details={"slot_indexes": list(p.get("slot_indexes") or []), "revision": p.get("revision")},
                )
            )
        elif kind == "allocation.released":
            out.append(Transition(at, "released", "released"))
        elif kind.startswith("baremetal."):  # a lease's provider phase, on the attempt's node
            phase = kind.removeprefix("baremetal.")
            out.append(
                Transition(
                    at,
                    kind,
                    _LEASE_STATES.get(phase, phase),
                    node,
                    message=p.get("message"),
                    details={
                        k: p[k] for k in ("provider", "machine_id", "provider_state", "adopted", "evidence") if k in p
                    },
                )
            )
    if alloc["status"] == "pending" and alloc["pending_code"] and alloc["pending_since"] is not None:
        out.append(
            Transition(
                alloc["pending_since"],
                "waiting",
                "pending",
                code=alloc["pending_code"],
                message=alloc["pending_message"],
            )
        )
    order = {
        "requested": 0,
        "placed": 1,
        "ready": 2,
        "attempt_failed": 3,
        "release_requested": 3,
        "cleanup_proven": 4,
        "released": 5,
        "waiting": 6,
    }
    # Steps of one transaction share a timestamp: break ties by the lifecycle's own order.
    return sorted(out, key=lambda t: (t.at, order.get(t.event, 1.5)))


# A lease phase -> the allocation's lifecycle state it shows (the node names the attempt).
_LEASE_STATES = {
    "deploy_requested": "provisioning",
    "deploying": "provisioning",
    "active": "ready",
    "deploy_failed": "provisioning",
    "release_requested": "releasing",
    "erasing": "cleanup",
    "erased": "cleanup",
    "erase_failed": "cleanup",
}
