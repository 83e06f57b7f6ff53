"""Reconciliation history: one row per run, like Flux's status history.

A row records the database backend that runs it; a row left `running` by a
process that died is marked `abandoned` (`sweep`) by the next start and by
every reader, so the history never shows ghosts.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from reconciler.store import revisions
from reconciler.store.connections import Connection
from schemas import dberrors


@dataclass(frozen=True, slots=True)
class Reconciliation:
    id: int
    revision: str | None
    source: str
    reconciler: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    result: str  # running | changed | unchanged | error | abandoned
    counts: dict[str, Any]
    errors: list[Any]


def reconciler_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def sweep(conn: Connection) -> int:
    """Mark runs whose backend is gone as abandoned; returns how many."""
    with dberrors.wrapped("sweep abandoned reconciliations"):
        row = conn.execute("SELECT gpuaas_sweep_abandoned()").fetchone()
    return int(row[0]) if row else 0


def start(conn: Connection, *, revision: str | None, source: str = "") -> int:
    sweep(conn)
    with dberrors.wrapped("record reconciliation start"):
        row = conn.execute(
            "INSERT INTO reconciliations (revision, source, reconciler) VALUES (%s, %s, %s) RETURNING id",
            (revision, source, reconciler_id()),
        ).fetchone()
    if row is None:  # pragma: no cover - INSERT ... RETURNING always returns the row
        raise dberrors.DatabaseError("reconciliations insert returned nothing")
    return int(row[0])


def finish(
    conn: Connection,
    run_id: int,
    *,
    result: str,
    counts: Mapping[str, Any] | None = None,
    problems: Sequence[Any] = (),
    revision: str | None = None,
) -> None:
    with dberrors.wrapped("record reconciliation end"):
        conn.execute(
            "UPDATE reconciliations SET finished_at = clock_timestamp(), result = %s, counts = %s,"
            " errors = %s, revision = coalesce(%s, revision) WHERE id = %s",
            (result, Jsonb(dict(counts or {})), Jsonb(list(problems)), revision, run_id),
        )


def recent(conn: Connection, limit: int = 20) -> list[Reconciliation]:
    """The newest runs; a run whose process died reads as abandoned (no write: read-only callers too)."""
    with dberrors.wrapped("read reconciliation history"):
        cur = conn.cursor(row_factory=class_row(Reconciliation))
        return cur.execute(
            "SELECT id, revision, source, reconciler, started_at, finished_at, result, counts,"
            " errors FROM reconciliation_history ORDER BY id DESC LIMIT %s",
            (limit,),
        ).fetchall()


@dataclass(frozen=True, slots=True)
class Health:
    """Is reconciliation making progress? What status, /readyz and /metrics say about the loop."""

    last_applied_revision: str | None
    last_applied_at: dt.datetime | None  # when the newest successful reconciliation finished
    failing_since: dt.datetime | None  # first failed run after it (None: not failing)
    failures: int  # failed runs since then
    failing_revision: str | None
    failing_code: str | None
    failing_message: str | None
    invalid_revision: str | None  # newest revision refused by validation after it (the last valid one stays)
    head: Head | None = None  # the newest revision a reconciler worked on (None: no history)

    @property
    def failing(self) -> bool:
        return self.failures > 0

    @property
    def head_applied(self) -> bool:
        return self.head is None or self.head.applied


@dataclass(frozen=True, slots=True)
class Head:
    """The newest revision recorded (what the branch points at, as the loop last saw it).

    Not applied: its newest row is a refusal (invalid, behind the applied
    revision) or a failure. `since` is when the store first fell behind it:
    the first row after the newest success that is about another revision.
    `code`/`message` are the first problem of its newest row.
    """

    revision: str | None
    applied: bool
    since: dt.datetime | None
    code: str | None
    message: str | None


def health(conn: Connection) -> Health:
    """Read-only: the newest success, and the failures (not validation refusals) recorded after it."""
    with dberrors.wrapped("read reconciliation health"):
        row = conn.execute(
            "WITH ok AS (SELECT id, revision, finished_at FROM reconciliations"
            "            WHERE result IN ('changed', 'unchanged') ORDER BY id DESC LIMIT 1),"
            " after AS (SELECT h.* FROM reconciliation_history h"
            "           WHERE h.id > coalesce((SELECT id FROM ok), 0)),"
            " bad AS (SELECT * FROM after WHERE result IN ('error', 'abandoned') AND NOT counts ?| %s),"
            " newest AS (SELECT * FROM bad ORDER BY id DESC LIMIT 1)"
            " SELECT (SELECT revision FROM ok), (SELECT finished_at FROM ok),"
            "        (SELECT min(started_at) FROM bad), (SELECT count(*) FROM bad),"
            "        (SELECT revision FROM newest), (SELECT errors -> -1 ->> 'code' FROM newest),"
            "        (SELECT errors -> -1 ->> 'message' FROM newest),"
            "        (SELECT revision FROM after WHERE counts ? %s ORDER BY id DESC LIMIT 1)",
            (list(revisions.REFUSAL_COUNTS), revisions.INVALID_COUNT),
        ).fetchone()
        head = conn.execute(
            "WITH ok AS (SELECT id, revision FROM reconciliations"
            "            WHERE result IN ('changed', 'unchanged') ORDER BY id DESC LIMIT 1),"
            " top AS (SELECT * FROM reconciliation_history ORDER BY id DESC LIMIT 1)"
            " SELECT top.revision, top.revision IS NOT DISTINCT FROM (SELECT revision FROM ok)"
            "                      AND EXISTS (SELECT 1 FROM ok) AND NOT top.counts ?| %s,"
            "        (SELECT min(started_at) FROM reconciliations r"
            "         WHERE r.id > coalesce((SELECT id FROM ok), 0)"
            "           AND r.revision IS DISTINCT FROM (SELECT revision FROM ok)),"
            "        top.errors -> 0 ->> 'code',"
            # FILE:LINE first when the problem has one (an invalid commit): what to open and fix
            "        concat_ws(': ', CASE WHEN top.errors -> 0 ? 'file' THEN concat(top.errors -> 0 ->> 'file',"
            "                        ':' || (top.errors -> 0 ->> 'line')) END, top.errors -> 0 ->> 'message')"
            " FROM top",
            (list(revisions.REFUSAL_COUNTS),),
        ).fetchone()
    if row is None:  # pragma: no cover - one row always
        raise dberrors.DatabaseError("reconciliation health returned nothing")
    top = None
    if head is not None:
        applied = bool(head[1])
        top = Head(
            head[0], applied, None if applied else head[2], None if applied else head[3], None if applied else head[4]
        )
    return Health(row[0], row[1], row[2], int(row[3] or 0), row[4], row[5], row[6], row[7], top)
