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

from reconciler.store import errors
from reconciler.store.connections import Connection


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
    with errors.wrapped("sweep abandoned reconciliations"):
        row = conn.execute("SELECT gpuaas_sweep_abandoned()").fetchone()
    return int(row[0]) if row else 0


def start(conn: Connection, *, revision: str | None, source: str = "") -> int:
    sweep(conn)
    with errors.wrapped("record reconciliation start"):
        row = conn.execute("INSERT INTO reconciliations (revision, source, reconciler) VALUES (%s, %s, %s)"
                           " RETURNING id", (revision, source, reconciler_id())).fetchone()
    if row is None:  # pragma: no cover - INSERT ... RETURNING always returns the row
        raise errors.DatabaseError("reconciliations insert returned nothing")
    return int(row[0])


def finish(conn: Connection, run_id: int, *, result: str, counts: Mapping[str, Any] | None = None,
           problems: Sequence[Any] = (), revision: str | None = None) -> None:
    with errors.wrapped("record reconciliation end"):
        conn.execute("UPDATE reconciliations SET finished_at = clock_timestamp(), result = %s, counts = %s,"
                     " errors = %s, revision = coalesce(%s, revision) WHERE id = %s",
                     (result, Jsonb(dict(counts or {})), Jsonb(list(problems)), revision, run_id))


def recent(conn: Connection, limit: int = 20) -> list[Reconciliation]:
    """The newest runs; a run whose process died reads as abandoned (no write: read-only callers too)."""
    with errors.wrapped("read reconciliation history"):
        cur = conn.cursor(row_factory=class_row(Reconciliation))
        return cur.execute("SELECT id, revision, source, reconciler, started_at, finished_at, result, counts,"
                           " errors FROM reconciliation_history ORDER BY id DESC LIMIT %s", (limit,)).fetchall()
