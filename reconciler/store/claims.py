"""Apply a Plan: placements become claims, pending reasons and releases are recorded.

Each placement attempt is one transaction: `gpuaas_place`
(schemas/sql/functions/gpuaas_place.sql) locks the allocation, the node row
and the chosen slots with SKIP LOCKED, re-checks them, and writes the claims
with their snapshot, the slot and allocation status and a
provisioning.requested outbox event, or writes nothing. A lost race (a row
locked or taken by another reconciler, or a constraint refusing the claim) is
retried with the planner's next candidate; after `max_claim_attempts` candidates
the allocation stays pending with the reason.

`place_many` sends up to `BATCH` placements in one round trip to the
procedure `gpuaas_place_batch`, which commits each attempt on its own (the
client's work and the network no longer sit between two commits); `place`
is one of them. It is the only placing path: a test's `fault` names a point
inside the procedure where it fails, so fault injection runs the SQL that
production runs. The connection must be in autocommit mode: every statement
here is its own transaction.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from psycopg.types.json import Jsonb

from desired import defaults
from reconciler import codes as reconciler_codes
from reconciler.plans import Pending, Placement, Plan, Release, ResolvedProfile
from reconciler.store.connections import Connection
from schemas import dberrors, snapshots
from schemas.errors import PermanentError

# Tests: a point inside gpuaas_place_batch where the first attempt that placed fails, after its
# claims, slots, allocation and outbox event are written and before its COMMIT. "claims_inserted"
# raises out of the call (a DatabaseError; nothing of that attempt may remain); "claims_conflict"
# is a serialization failure there, a lost race the next candidate answers.
Fault = Literal["claims_inserted", "claims_conflict"]

# Stable pending codes written by apply itself (the planner brings its own).
CONFLICT_EXHAUSTED = reconciler_codes.CLAIM_CONFLICT_EXHAUSTED
CANDIDATES_REFUSED = reconciler_codes.CLAIM_CANDIDATES_REFUSED


class Outcome(enum.StrEnum):
    PLACED = "placed"
    LOST_RACE = "lost_race"
    REFUSED = "refused"
    BUSY = "busy"  # another reconciler holds the allocation row right now
    NOT_PENDING = "not_pending"  # already placed (or released) by someone
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Attempt:
    node: str
    slot_indexes: tuple[int, ...]
    outcome: Outcome
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class PlacementResult:
    allocation_id: str
    outcome: Outcome  # PLACED, or why the last attempt stopped
    node: str | None = None
    slot_indexes: tuple[int, ...] = ()
    claim_ids: tuple[str, ...] = ()
    attempts: tuple[Attempt, ...] = ()
    pending_code: str | None = None
    pending_message: str | None = None

    @property
    def placed(self) -> bool:
        return self.outcome is Outcome.PLACED

    @property
    def conflicts(self) -> int:
        return sum(1 for a in self.attempts if a.outcome is Outcome.LOST_RACE)


@dataclass(frozen=True, slots=True)
class PendingResult:
    allocation_id: str
    code: str
    message: str
    changed: bool


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    allocation_id: str
    outcome: str  # releasing | cancelled | unchanged | unknown
    node: str | None = None
    slot_indexes: tuple[int, ...] = ()

    @property
    def changed(self) -> bool:
        return self.outcome in ("releasing", "cancelled")


@dataclass(frozen=True, slots=True)
class ApplyResult:
    placements: tuple[PlacementResult, ...] = ()
    pending: tuple[PendingResult, ...] = ()
    releases: tuple[ReleaseResult, ...] = ()
    cancelled: tuple[str, ...] = field(default=())

    @property
    def placed(self) -> tuple[PlacementResult, ...]:
        return tuple(p for p in self.placements if p.placed)

    @property
    def conflicts_retried(self) -> int:
        return sum(p.conflicts for p in self.placements)

    @property
    def changed(self) -> bool:
        return bool(
            self.placed
            or any(p.changed for p in self.pending)
            or any(r.changed for r in self.releases)
            or self.cancelled
            or any(p.pending_code for p in self.placements)
        )


def _require_autocommit(conn: Connection) -> None:
    if not conn.autocommit:
        raise PermanentError(
            "apply needs an autocommit connection (one transaction per placement)",
            code=reconciler_codes.DB_APPLY_AUTOCOMMIT,
        )


def _candidates(placement: Placement, max_claim_attempts: int) -> list[tuple[str, tuple[int, ...]]]:
    out = [(placement.node, tuple(placement.slot_indexes))]
    for alt in placement.alternatives:
        cand = (alt.node, tuple(alt.slot_indexes))
        if cand not in out:
            out.append(cand)
    return out[: max(1, max_claim_attempts)]


_PLACE_BATCH = (
    "CALL gpuaas_place_batch(%s::text[], %s::text[], %s::jsonb[], %s::text[], %s::integer[],"
    " %s::text[], %s::text[], %s::text, %s::text)"
)
BATCH = 100  # placements per round trip in place_many
_FINAL = (Outcome.BUSY, Outcome.NOT_PENDING, Outcome.UNKNOWN)


def _profile_json(profile: ResolvedProfile | None) -> str | None:
    """The snapshot profile as the SQL parameter's text (the database casts it to jsonb)."""
    doc = snapshots.profile_to_json(profile)
    return None if doc is None else json.dumps(doc)


def _finish(
    conn: Connection, placement: Placement, attempts: list[Attempt], claim_ids: tuple[str, ...]
) -> PlacementResult:
    """The result of a placement's attempts; pending with the reason when its candidates ran out."""
    last = attempts[-1] if attempts else None
    if last is not None and last.outcome is Outcome.PLACED:
        return PlacementResult(
            placement.allocation_id, last.outcome, last.node, last.slot_indexes, claim_ids, tuple(attempts)
        )
    if last is not None and last.outcome in _FINAL:
        return PlacementResult(placement.allocation_id, last.outcome, attempts=tuple(attempts))
    raced = sum(1 for a in attempts if a.outcome is Outcome.LOST_RACE)
    code = CONFLICT_EXHAUSTED if raced else CANDIDATES_REFUSED
    tried = "; ".join(f"{a.node}{list(a.slot_indexes)}: {a.detail}" for a in attempts)
    message = (
        f"lost the race for all {len(attempts)} candidate(s); retried on the next reconciliation ({tried})"
        if raced
        else f"every candidate was refused on re-check ({tried})"
    )
    record_pending(
        conn,
        Pending(
            placement.allocation_id,
            code,
            message,
            {"attempts": [[a.node, list(a.slot_indexes), a.outcome.value] for a in attempts]},
        ),
    )
    return PlacementResult(
        placement.allocation_id,
        last.outcome if last else Outcome.LOST_RACE,
        attempts=tuple(attempts),
        pending_code=code,
        pending_message=message,
    )


def place(
    conn: Connection,
    placement: Placement,
    *,
    revision: str | None = None,
    max_claim_attempts: int = defaults.CLAIM_CANDIDATES,
    fault: Fault | None = None,
) -> PlacementResult:
    """Claim the placement's node/slots, or its next candidates after a lost race."""
    return place_many(conn, [placement], revision=revision, max_claim_attempts=max_claim_attempts, fault=fault)[0]


def place_many(
    conn: Connection,
    placements: Sequence[Placement],
    *,
    revision: str | None = None,
    max_claim_attempts: int = defaults.CLAIM_CANDIDATES,
    fault: Fault | None = None,
) -> list[PlacementResult]:
    """`place` for each placement, in order, `BATCH` of them per round trip; one transaction per attempt.

    A `fault` fires once: in the first round trip.
    """
    _require_autocommit(conn)
    out: list[PlacementResult] = []
    for start in range(0, len(placements), BATCH):
        out += _place_batch(conn, placements[start : start + BATCH], revision, max_claim_attempts, fault)
        fault = None
    return out


def _place_batch(
    conn: Connection, batch: Sequence[Placement], revision: str | None, max_claim_attempts: int, fault: Fault | None
) -> list[PlacementResult]:
    """One CALL for the batch; after a refusal the database raised (rare), one more from where it stopped."""
    cands = [_candidates(p, max_claim_attempts) for p in batch]
    attempts: list[list[Attempt]] = [[] for _ in batch]
    ids: list[tuple[str, ...]] = [() for _ in batch]
    start, skip = 0, 0  # placement `start` first, minus the first `skip` of its candidates (already tried)
    while start < len(batch):
        todo = [(k, cands[k][skip:] if k == start else cands[k]) for k in range(start, len(batch))]
        args = (
            [batch[k].allocation_id for k, _ in todo],
            [batch[k].claim_kind.value for k, _ in todo],
            [_profile_json(batch[k].profile) for k, _ in todo],
            [batch[k].image for k, _ in todo],
            [len(c) for _, c in todo],
            [node for _, c in todo for node, _ in c],
            ["{" + ",".join(map(str, slots)) + "}" for _, c in todo for _, slots in c],
            revision,
            fault,
        )
        fault = None  # injected once; the call after a lost race runs clean
        with dberrors.wrapped(f"place {len(todo)} allocation(s)"):
            row = conn.execute(_PLACE_BATCH, args).fetchone()
        if row is None:  # pragma: no cover - CALL always returns its INOUT parameters
            raise PermanentError("gpuaas_place_batch returned nothing", code=reconciler_codes.DB_APPLY_NO_RESULT)
        r_placement, r_candidate, r_outcome, r_detail, r_ids, sqlstate, constraint = row
        stopped = None
        for p, c, outcome, detail, claim_ids in zip(r_placement, r_candidate, r_outcome, r_detail, r_ids, strict=True):
            k, cand = todo[p - 1]
            node, slots = cand[c - 1]
            if outcome == "error":  # always the last entry: the batch stopped there
                err = dberrors.refusal(sqlstate, constraint, detail or "", f"place {batch[k].allocation_id} on {node}")
                if not (
                    isinstance(err, dberrors.SerializationConflict)
                    or (isinstance(err, dberrors.ConstraintRefused) and err.lost_race)
                ):
                    for earlier in range(k):
                        _finish(conn, batch[earlier], attempts[earlier], ids[earlier])
                    raise err
                attempts[k].append(Attempt(node, slots, Outcome.LOST_RACE, f"{err.code}: {err.message}"))
                stopped = (k, len(cands[k]) - len(cand) + c)
            else:
                attempts[k].append(Attempt(node, slots, Outcome(outcome), detail))
                ids[k] = tuple(claim_ids.split(",")) if claim_ids else ()
        if stopped is None:
            break
        start, skip = stopped
        if skip >= len(cands[start]):
            start, skip = start + 1, 0
    return [_finish(conn, p, a, d) for p, a, d in zip(batch, attempts, ids, strict=True)]


def record_pending(conn: Connection, pending: Pending) -> PendingResult:
    """Store why an allocation waits; no write when the reason is unchanged."""
    details: dict[str, Any] = dict(pending.details)
    with dberrors.wrapped(f"record pending reason of {pending.allocation_id}"):
        cur = conn.execute(
            "UPDATE allocations SET pending_code = %s, pending_message = %s, pending_details = %s,"
            " pending_since = coalesce(pending_since, now()), updated_at = now()"
            " WHERE id = %s AND status = 'pending'"
            " AND (pending_code, pending_message) IS DISTINCT FROM (%s, %s)",
            (pending.code, pending.message, Jsonb(details), pending.allocation_id, pending.code, pending.message),
        )
    return PendingResult(pending.allocation_id, pending.code, pending.message, cur.rowcount > 0)


def release(conn: Connection, rel: Release, *, revision: str | None = None) -> ReleaseResult:
    """Desired state says released: claims -> releasing, slots -> cleanup (no freeing here)."""
    _require_autocommit(conn)
    with dberrors.wrapped(f"release {rel.allocation_id}"):
        row = conn.execute(
            "SELECT outcome, node, slot_indexes FROM gpuaas_release(%s, %s)", (rel.allocation_id, revision)
        ).fetchone()
    if row is None:  # pragma: no cover
        raise PermanentError("gpuaas_release returned nothing", code=reconciler_codes.DB_APPLY_NO_RESULT)
    outcome, node, idx = row
    return ReleaseResult(rel.allocation_id, str(outcome), node, tuple(int(i) for i in idx or ()))


def cancel_unplaced(conn: Connection) -> tuple[str, ...]:
    """Allocations released in git while they hold no claim are simply released.

    That is one never placed (pending), and one that failed for good: its
    attempts' claims were retired and go through cleanup on their own, so
    the tenant's release ends it (`released`; the failure code, message and
    attempts stay for the record).
    """
    with dberrors.wrapped("release unplaced allocations"):
        rows = conn.execute(
            "UPDATE allocations SET status = 'released', released_at = now(), pending_code = NULL,"
            " pending_message = NULL, pending_details = NULL, pending_since = NULL, updated_at = now(),"
            " status_changed_at = now()"
            " WHERE status IN ('pending', 'failed') AND desired_state = 'released' RETURNING id"
        ).fetchall()
    return tuple(sorted(str(r[0]) for r in rows))


def apply(
    conn: Connection,
    plan: Plan,
    *,
    revision: str | None = None,
    max_claim_attempts: int = defaults.CLAIM_CANDIDATES,
    fault: Fault | None = None,
) -> ApplyResult:
    """Write the whole plan: releases, placements (one transaction each), pending reasons."""
    _require_autocommit(conn)
    releases = tuple(release(conn, r, revision=revision) for r in plan.releases)
    placements = tuple(
        place_many(conn, plan.placements, revision=revision, max_claim_attempts=max_claim_attempts, fault=fault)
    )
    pending = tuple(record_pending(conn, p) for p in plan.pending)
    cancelled = cancel_unplaced(conn)
    return ApplyResult(placements, pending, releases, cancelled)


def placed_nodes(result: ApplyResult) -> Sequence[str]:
    nodes = {p.node for p in result.placed if p.node}
    nodes |= {r.node for r in result.releases if r.node and r.changed}
    return sorted(nodes)
