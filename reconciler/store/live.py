"""Read what the planner cannot learn from git: claims, slot states, host facts.

`observe` returns the planner's `Observed` value; nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from psycopg.rows import class_row

from reconciler.plans import ExistingClaim, Observed, SlotKey
from reconciler.store import leases, lifecycle
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.states import ClaimKind, ClaimStatus, SlotStatus

_LIVE = ("reserved", "provisioning", "active", "releasing")


@dataclass(frozen=True, slots=True)
class _ClaimRow:
    allocation_id: str
    node: str
    claim_kind: str
    slot_index: int | None
    status: str
    tenant: str
    retired_attempt: int | None  # the claim belongs to a failed attempt (releasing on the failed node)


def observe(conn: Connection) -> Observed:
    with dberrors.wrapped("read observed state"):
        claims = conn.cursor(row_factory=class_row(_ClaimRow)).execute(
            "SELECT c.allocation_id, n.name AS node, c.claim_kind, c.slot_index, c.status, a.tenant,"
            " rc.attempt AS retired_attempt"
            " FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
            " JOIN allocations a ON a.id = c.allocation_id"
            " LEFT JOIN retired_claims rc ON rc.claim_id = c.id"
            " WHERE c.status = ANY(%s) ORDER BY n.name, c.slot_index NULLS FIRST, c.allocation_id",
            (list(_LIVE),)).fetchall()
        # Slots that are neither free nor simply claimed.
        odd = conn.execute(
            "SELECT n.name, s.slot_index, s.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE s.status IN ('releasing', 'cleanup', 'cleanup_blocked', 'failed', 'disabled',"
            " 'quarantined')").fetchall()
        hosts = conn.execute("SELECT node_name, healthy, firmware_ready FROM host_status").fetchall()
        # A failed attempt's claims do not make the allocation placed: it is pending again.
        placed = conn.execute(
            "SELECT id FROM allocations WHERE status <> 'pending'"
            " UNION SELECT DISTINCT c.allocation_id FROM allocation_resource_claims c"
            " WHERE NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)").fetchall()
        cached = conn.execute(
            "SELECT node_name, array_agg(digest_sha256 ORDER BY digest_sha256) FROM node_image_cache"
            " GROUP BY node_name").fetchall()
    silent = lifecycle.silent_nodes(conn)
    # Baremetal (issue 30): a machine quarantined after a failed deploy takes nothing new, and a
    # slice-tagged node a lease wrote over serves no slice until its host agent reports again.
    blocked = leases.blocked_nodes(conn)
    owed = leases.profile_debts(conn)
    avoid = lifecycle.avoided_nodes(conn)
    slot_status: dict[SlotKey, SlotStatus] = {(str(n), int(i)): SlotStatus(str(s)) for n, i, s in odd}
    return Observed(
        claims=tuple(ExistingClaim(allocation_id=c.allocation_id if c.retired_attempt is None
                                   else lifecycle.retired_label(c.allocation_id, c.retired_attempt),
                                   node=c.node, kind=ClaimKind(c.claim_kind),
                                   slot_index=c.slot_index, status=ClaimStatus(c.status), tenant=c.tenant)
                     for c in claims),
        slot_status=MappingProxyType(slot_status),
        firmware_ready=MappingProxyType({str(n): bool(f) for n, _, f in hosts if f is not None}
                                        | {n: False for n in owed}),
        unavailable_nodes=frozenset(str(n) for n, healthy, _ in hosts if healthy is False) | silent | blocked,
        placed=frozenset(str(r[0]) for r in placed),
        avoid=MappingProxyType(avoid),
        image_cache=MappingProxyType({str(n): frozenset(str(d) for d in ds) for n, ds in cached}),
    )


def free_slots(conn: Connection) -> dict[str, list[int]]:
    """Claimable slots per node (available, eligible, on a present active node)."""
    with dberrors.wrapped("read free slots"):
        rows = conn.execute(
            "SELECT n.name, array_agg(s.slot_index ORDER BY s.slot_index)"
            " FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE s.status = 'available' AND s.present AND s.eligible AND n.present"
            " AND n.admin_state = 'active' GROUP BY n.name ORDER BY n.name").fetchall()
    return {str(name): [int(i) for i in idx] for name, idx in rows}
