"""psycopg errors become project errors with stable codes; none leak.

Constraint and trigger refusals carry the constraint name (triggers raise with
`CONSTRAINT = ...`), which maps to a stable `claim.*` code. A refusal caused
by a concurrent writer is a lost race, worth the planner's next candidate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pge

from schemas.errors import PermanentError, TemporaryError

# constraint or trigger name -> stable code. Do not change the string values.
CONSTRAINT_CODES = {
    "claims_one_live_per_slot": "claim.slot_taken",
    "claims_node_exclusive": "claim.node_overlap",
    "claims_slot_claimable": "claim.slot_not_claimable",
    "claims_node_claimable": "claim.node_not_claimable",
    "claims_allocation_pending": "claim.allocation_not_pending",
    "claims_allocation_one_node": "claim.allocation_other_node",
    "claims_not_on_failed_node": "claim.node_failed_before",
    "claims_created_live": "claim.created_not_live",
    "claims_immutable": "claim.immutable",
    "claims_status_transition": "claim.bad_transition",
    "claims_release_needs_proof": "claim.release_needs_proof",
    "claims_no_delete": "claim.no_delete",
    "claims_kind_shape": "claim.kind_shape",
    "claims_slot_of_node": "claim.slot_of_other_node",
    "slots_free_without_claim": "slot.free_with_live_claim",
    "slots_claimed_needs_claim": "slot.claimed_without_claim",
    "endpoints_one_live_per_port": "ingress.port_taken",
    "endpoints_one_live_per_guest_port": "ingress.guest_port_taken",
    "endpoints_ports_exhausted": "ingress.ports_exhausted",
    "endpoints_no_delete": "ingress.no_delete",
}

# Refusals a concurrent placement can cause: the next candidate may succeed.
RACE_CODES = frozenset(
    {
        "claim.slot_taken",
        "claim.node_overlap",
        "claim.slot_not_claimable",
        "claim.allocation_not_pending",
        # A public port taken by a concurrent placement, or a node whose ingress range is full: another
        # candidate (another node) may still have one.
        "ingress.port_taken",
        "ingress.ports_exhausted",
    }
)


class DatabaseUnavailable(TemporaryError):
    code = "db.unavailable"


class DatabaseError(PermanentError):
    code = "db.error"


class ConstraintRefused(PermanentError):
    """The database refused a write that would break an invariant."""

    code = "db.constraint"

    def __init__(self, message: str, *, code: str | None = None, constraint: str | None = None) -> None:
        super().__init__(message, code=code)
        self.constraint = constraint

    @property
    def lost_race(self) -> bool:
        return self.code in RACE_CODES


class SerializationConflict(TemporaryError):
    code = "db.conflict"


# SQLSTATEs of a concurrent writer getting in the way: serialization failure,
# deadlock detected, lock not available.
CONFLICT_STATES = frozenset({"40001", "40P01", "55P03"})


def refusal(sqlstate: str, constraint: str | None, message: str, doing: str) -> PermanentError | TemporaryError:
    """The project error for a refusal the database reported as parts (see `gpuaas_place_batch`)."""
    first = message.strip()
    if sqlstate.startswith("23"):  # integrity_constraint_violation
        code = CONSTRAINT_CODES.get(constraint or "", "db.constraint")
        return ConstraintRefused(f"{doing}: {first}", code=code, constraint=constraint)
    if sqlstate in CONFLICT_STATES:
        return SerializationConflict(f"{doing}: {first}", delay=0.05)
    return DatabaseError(f"{doing}: {first}")


def translate(e: psycopg.Error, doing: str) -> PermanentError | TemporaryError:
    """The project error for a psycopg error (the caller raises it `from e`)."""
    diag = e.diag
    first = (diag.message_primary or str(e)).strip()
    if isinstance(e, pge.IntegrityError):
        return refusal("23000", diag.constraint_name, first, doing)
    if isinstance(e, pge.SerializationFailure | pge.DeadlockDetected | pge.LockNotAvailable):
        return refusal("40001", None, first, doing)
    if isinstance(e, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(f"{doing}: {first}")
    return DatabaseError(f"{doing}: {first}")


@contextmanager
def wrapped(doing: str) -> Iterator[None]:
    """Run a block; a psycopg error leaves it as a project error."""
    try:
        yield
    except psycopg.Error as e:
        raise translate(e, doing) from e
