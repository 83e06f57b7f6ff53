"""What the watch loop asks the store before it reconciles: is this revision applied, may I apply it?

Several reconcilers may watch the same repository against one database. The
store already makes a repeated reconciliation harmless (the sync writes
nothing, a placed allocation is never placed again, SKIP LOCKED keeps two
placements of one allocation apart), but a revision must also be *applied*
once: one history row, one set of outbox events. So each application takes
a session advisory lock named after the revision (`try_lock`: never waits;
another holder means "someone is applying it right now") and, holding it,
checks the history for a finished application of that revision
(`applied_by`). An invalid revision is recorded once as well, so a second
reconciler does not report it again.

`work` answers the loop's periodic question without writing: is there
anything a reconciliation of the same revision could move forward now?
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from reconciler.store.connections import Connection
from schemas import dberrors

APPLY_SOURCE = "apply"  # history.source prefix of a new revision's application
RETRY_SOURCE = "retry"  # history.source prefix of a periodic retry of the same revision
INVALID_COUNT = "validation_errors"  # counts key of a revision refused by validation
BEHIND_COUNT = "head_behind"  # counts key of a revision refused as older than the applied one (force-push, rollback)
REFUSAL_COUNTS = (INVALID_COUNT, BEHIND_COUNT)  # refusals: HEAD not applied, yet nothing is failing


def lock_key(revision: str) -> int:
    """A signed 64-bit advisory lock key for one revision."""
    digest = hashlib.sha256(f"gpuaas.revision:{revision}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextmanager
def try_lock(conn: Connection, revision: str) -> Iterator[bool]:
    """Hold the revision's session lock for the block; yields False when another session holds it."""
    key = lock_key(revision)
    with dberrors.wrapped("lock revision"):
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
    got = bool(row and row[0])
    try:
        yield got
    finally:
        if got and not conn.closed:
            with dberrors.wrapped("unlock revision"):
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


def applied_by(conn: Connection, revision: str) -> str | None:
    """The reconciler that finished applying `revision`, if any did."""
    with dberrors.wrapped("read reconciliation history"):
        row = conn.execute(
            "SELECT reconciler FROM reconciliations WHERE revision = %s AND result IN ('changed', 'unchanged')"
            " ORDER BY id LIMIT 1",
            (revision,),
        ).fetchone()
    return str(row[0]) if row else None


def refused_by(conn: Connection, revision: str) -> str | None:
    """The reconciler that refused `revision` (invalid, or behind) since the newest success, if any did.

    Only since the newest success: after the store moved (a restore, a truncation) and the
    revision in force was applied again, a HEAD that is still refused is recorded again, so
    the newest history row keeps saying what HEAD is.
    """
    with dberrors.wrapped("read reconciliation history"):
        row = conn.execute(
            "SELECT reconciler FROM reconciliations WHERE revision = %s AND result = 'error'"
            " AND counts ?| %s AND id > coalesce((SELECT max(id) FROM reconciliations"
            "                                     WHERE result IN ('changed', 'unchanged')), 0)"
            " ORDER BY id LIMIT 1",
            (revision, list(REFUSAL_COUNTS)),
        ).fetchone()
    return str(row[0]) if row else None


def latest_applied(conn: Connection) -> str | None:
    """The revision of the newest successful reconciliation, whoever ran it (the loop, `gpuaas apply`)."""
    with dberrors.wrapped("read reconciliation history"):
        row = conn.execute(
            "SELECT revision FROM reconciliations WHERE result IN ('changed', 'unchanged') ORDER BY id DESC LIMIT 1"
        ).fetchone()
    return str(row[0]) if row else None


def started_at(conn: Connection, run_id: int) -> dt.datetime | None:
    with dberrors.wrapped("read reconciliation history"):
        row = conn.execute("SELECT started_at FROM reconciliations WHERE id = %s", (run_id,)).fetchone()
    return row[0] if row else None


@dataclass(frozen=True, slots=True)
class Work:
    pending: bool  # allocations wait for placement
    host_reports: bool  # claims wait for a host, and a host reported since our last reconciliation

    @property
    def any(self) -> bool:
        return self.pending or self.host_reports


def work(conn: Connection, since: dt.datetime | None) -> Work:
    """What a reconciliation of the same revision might move forward now (`since`: our last start)."""
    with dberrors.wrapped("check for work"):
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM allocations WHERE present AND status = 'pending'"
            "               AND desired_state = 'present'),"
            " EXISTS (SELECT 1 FROM allocation_resource_claims WHERE status IN ('reserved', 'provisioning',"
            "         'releasing'))"
            " AND (%(since)s::timestamptz IS NULL"
            "      OR EXISTS (SELECT 1 FROM host_slot_status WHERE updated_at >= %(since)s)"
            "      OR EXISTS (SELECT 1 FROM host_status WHERE reported_at >= %(since)s"
            "                 OR cleanup_reported_at >= %(since)s))",
            {"since": since},
        ).fetchone()
    return Work(bool(row and row[0]), bool(row and row[1]))
