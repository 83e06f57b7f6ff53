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

from schemas import codes as schemas_codes
from schemas.errors import PermanentError, TemporaryError

# constraint or trigger name -> stable code. Do not change the string values.
CONSTRAINT_CODES = {
    "claims_one_live_per_slot": schemas_codes.CLAIM_SLOT_TAKEN,
    "claims_node_exclusive": schemas_codes.CLAIM_NODE_OVERLAP,
    "claims_slot_claimable": schemas_codes.CLAIM_SLOT_NOT_CLAIMABLE,
    "claims_node_claimable": schemas_codes.CLAIM_NODE_NOT_CLAIMABLE,
    "claims_allocation_pending": schemas_codes.CLAIM_ALLOCATION_NOT_PENDING,
    "claims_allocation_one_node": schemas_codes.CLAIM_ALLOCATION_OTHER_NODE,
    "claims_not_on_failed_node": schemas_codes.CLAIM_NODE_FAILED_BEFORE,
    "claims_created_live": schemas_codes.CLAIM_CREATED_NOT_LIVE,
    "claims_immutable": schemas_codes.CLAIM_IMMUTABLE,
    "claims_status_transition": schemas_codes.CLAIM_BAD_TRANSITION,
    "claims_release_needs_proof": schemas_codes.CLAIM_RELEASE_NEEDS_PROOF,
    "claims_no_delete": schemas_codes.CLAIM_NO_DELETE,
    "claims_kind_shape": schemas_codes.CLAIM_KIND_SHAPE,
    "claims_slot_of_node": schemas_codes.CLAIM_SLOT_OF_OTHER_NODE,
    "slots_free_without_claim": schemas_codes.SLOT_FREE_WITH_LIVE_CLAIM,
    "slots_claimed_needs_claim": schemas_codes.SLOT_CLAIMED_WITHOUT_CLAIM,
    "endpoints_one_live_per_port": schemas_codes.INGRESS_PORT_TAKEN,
    "endpoints_one_live_per_guest_port": schemas_codes.INGRESS_GUEST_PORT_TAKEN,
    "endpoints_ports_exhausted": schemas_codes.INGRESS_PORTS_EXHAUSTED,
    "endpoints_no_delete": schemas_codes.INGRESS_NO_DELETE,
}

# Refusals a concurrent placement can cause: the next candidate may succeed.
RACE_CODES = frozenset(
    {
        schemas_codes.CLAIM_SLOT_TAKEN,
        schemas_codes.CLAIM_NODE_OVERLAP,
        schemas_codes.CLAIM_SLOT_NOT_CLAIMABLE,
        schemas_codes.CLAIM_ALLOCATION_NOT_PENDING,
        # A public port taken by a concurrent placement, or a node whose ingress range is full: another
        # candidate (another node) may still have one.
        schemas_codes.INGRESS_PORT_TAKEN,
        schemas_codes.INGRESS_PORTS_EXHAUSTED,
    }
)


class DatabaseUnavailable(TemporaryError):
    code = schemas_codes.DB_UNAVAILABLE


class DatabaseError(PermanentError):
    code = schemas_codes.DB_ERROR


class ConstraintRefused(PermanentError):
    """The database refused a write that would break an invariant."""

    code = schemas_codes.DB_CONSTRAINT

    def __init__(self, message: str, *, code: str | None = None, constraint: str | None = None) -> None:
        super().__init__(message, code=code)
        self.constraint = constraint

    @property
    def lost_race(self) -> bool:
        return self.code in RACE_CODES


class SerializationConflict(TemporaryError):
    code = schemas_codes.DB_CONFLICT


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
