"""Invariant queries: what `gpuaas db check` runs after anything went wrong.

The constraints already refuse these states; the checks prove, after a crash,
a kill or a bug, that none slipped through (and catch the cross-table rules a
constraint cannot express, such as "a placed allocation has its outbox event").
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.store.connections import Connection
from schemas import dberrors


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    description: str
    query: str  # returns one text column naming each offender


@dataclass(frozen=True, slots=True)
class Violation:
    name: str
    description: str
    count: int
    sample: tuple[str, ...]

    def render(self) -> str:
        more = f" (+{self.count - len(self.sample)} more)" if self.count > len(self.sample) else ""
        return f"{self.name}: {self.count} {self.description}: {', '.join(self.sample)}{more}"


CHECKS: tuple[Check, ...] = (
    Check(
        "double_claims",
        "slot(s) with more than one live claim",
        """
        SELECT n.name || ':' || c.slot_index FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id
        WHERE c.slot_id IS NOT NULL AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
        GROUP BY n.name, c.slot_index HAVING count(*) > 1""",
    ),
    Check(
        "exclusive_overlap",
        "node(s) with a node_exclusive claim beside another live claim",
        """
        SELECT n.name FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id
        WHERE c.status IN ('reserved', 'provisioning', 'active', 'releasing')
        GROUP BY n.name HAVING bool_or(c.claim_kind = 'node_exclusive') AND count(*) > 1""",
    ),
    Check(
        "held_slot_without_one_claim",
        "held slot(s) without exactly one live claim",
        """
        SELECT n.name || ':' || s.slot_index || ' ' || s.status
        FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
        WHERE s.status IN ('reserved', 'provisioning', 'active', 'releasing', 'cleanup', 'cleanup_blocked')
          AND (SELECT count(*) FROM allocation_resource_claims c
               WHERE c.slot_id = s.id
                 AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) <> 1""",
    ),
    Check(
        "claimed_slot_looks_free",
        "slot(s) available or disabled under a live claim",
        """
        SELECT n.name || ':' || s.slot_index || ' ' || s.status
        FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
        JOIN allocation_resource_claims c ON c.slot_id = s.id
             AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
        WHERE s.status IN ('available', 'disabled')""",
    ),
    Check(
        "placed_without_claims",
        "placed allocation(s) without live claims",
        """
        SELECT a.id || ' ' || a.status FROM allocations a
        WHERE a.status IN ('reserved', 'provisioning', 'active', 'releasing')
          AND NOT EXISTS (SELECT 1 FROM allocation_resource_claims c
                          WHERE c.allocation_id = a.id
                            AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'))""",
    ),
    Check(
        "placed_without_event",
        "placed allocation(s) without a provisioning.requested event",
        """
        SELECT a.id FROM allocations a
        WHERE a.placed_at IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.aggregate_id = a.id
                          AND o.event_type = 'provisioning.requested')""",
    ),
    # A failed attempt's claims (retired_claims, 0011) keep releasing while the allocation is placed again.
    Check(
        "claims_of_unplaced",
        "live claim(s) of an allocation that is pending or released",
        """
        SELECT c.allocation_id || ' ' || a.status FROM allocation_resource_claims c
        JOIN allocations a ON a.id = c.allocation_id
        WHERE c.status IN ('reserved', 'provisioning', 'active', 'releasing')
          AND a.status IN ('pending', 'released')
          AND NOT EXISTS (SELECT 1 FROM retired_claims r WHERE r.claim_id = c.id)""",
    ),
    Check(
        "allocation_on_many_nodes",
        "allocation(s) with live claims on more than one node",
        """
        SELECT allocation_id FROM allocation_resource_claims c
        WHERE status IN ('reserved', 'provisioning', 'active', 'releasing')
          AND NOT EXISTS (SELECT 1 FROM retired_claims r WHERE r.claim_id = c.id)
        GROUP BY allocation_id HAVING count(DISTINCT node_id) > 1""",
    ),
    Check(
        "retired_claim_not_released",
        "claim(s) of a failed attempt that are not releasing or released",
        """
        SELECT c.allocation_id || ' ' || n.name || ':' || coalesce(c.slot_index::text, '*') || ' ' || c.status
        FROM retired_claims r JOIN allocation_resource_claims c ON c.id = r.claim_id
        JOIN nodes n ON n.id = c.node_id
        WHERE c.status IN ('reserved', 'provisioning', 'active')""",
    ),
    Check(
        "placed_on_failed_node",
        "allocation(s) holding claims on a node where an attempt failed",
        """
        SELECT DISTINCT c.allocation_id || ' ' || t.node FROM allocation_resource_claims c
        JOIN nodes n ON n.id = c.node_id
        JOIN allocation_attempts t ON t.allocation_id = c.allocation_id AND t.node = n.name
        WHERE c.status IN ('reserved', 'provisioning', 'active', 'releasing')
          AND NOT EXISTS (SELECT 1 FROM retired_claims r WHERE r.claim_id = c.id)""",
    ),
    Check(
        "attempt_without_retired_claims",
        "failed attempt(s) whose claims were not retired",
        """
        SELECT t.allocation_id || ' #' || t.attempt FROM allocation_attempts t
        WHERE NOT EXISTS (SELECT 1 FROM retired_claims r
                          WHERE r.allocation_id = t.allocation_id AND r.attempt = t.attempt)""",
    ),
    Check(
        "quarantine_without_evidence",
        "quarantined slot(s) without evidence",
        """
        SELECT n.name || ':' || s.slot_index FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
        WHERE s.status = 'quarantined' AND s.quarantine IS NULL""",
    ),
    Check(
        "exhausted_not_failed",
        "allocation(s) whose last attempt failed for good but that are not failed",
        """
        SELECT a.id || ' ' || a.status FROM allocations a
        JOIN allocation_attempts t ON t.allocation_id = a.id AND t.outcome = 'failed'
        WHERE a.status NOT IN ('failed', 'releasing', 'released')""",
    ),
    Check(
        "slice_claim_count",
        "slice allocation(s) whose live slot claims differ from the GPU count",
        """
        SELECT a.id || ' ' || count(c.id) || '/' || a.gpu_count FROM allocations a
        JOIN allocation_resource_claims c ON c.allocation_id = a.id
             AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
             AND NOT EXISTS (SELECT 1 FROM retired_claims r WHERE r.claim_id = c.id)
        WHERE a.capacity_shape = 'gpu_slice' AND a.status IN ('reserved', 'provisioning', 'active')
        GROUP BY a.id HAVING count(c.id) <> a.gpu_count""",
    ),
    Check(
        "endpoint_without_claim",
        "live public endpoint(s) of an allocation with no live claim on that node",
        """
        SELECT e.allocation_id || ' ' || host(e.public_address) || ':' || e.public_port FROM allocation_endpoints e
        WHERE e.freed_at IS NULL AND NOT EXISTS (
            SELECT 1 FROM allocation_resource_claims c WHERE c.allocation_id = e.allocation_id
            AND c.node_id = e.node_id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'))""",
    ),
    Check(
        "shared_endpoint_port",
        "public address:port(s) held by more than one live endpoint",
        """
        SELECT host(public_address) || ':' || public_port FROM allocation_endpoints WHERE freed_at IS NULL
        GROUP BY public_address, public_port HAVING count(*) > 1""",
    ),
)

DOUBLE_CLAIM_CHECKS = ("double_claims", "exclusive_overlap")


def run(conn: Connection, *, sample: int = 5) -> list[Violation]:
    """Every violated invariant (empty list: the store is sound)."""
    found = []
    with dberrors.wrapped("check invariants"):
        for check in CHECKS:
            rows = conn.execute(check.query.encode()).fetchall()
            if rows:
                found.append(
                    Violation(check.name, check.description, len(rows), tuple(str(r[0]) for r in rows[:sample]))
                )
    return found


def double_claims(violations: list[Violation]) -> int:
    return sum(v.count for v in violations if v.name in DOUBLE_CLAIM_CHECKS)
