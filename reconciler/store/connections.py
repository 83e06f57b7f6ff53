"""Where the database is, and connecting to it.

An explicit URL (--db-url), else GPUAAS_DATABASE_URL, names an external
PostgreSQL; without one the embedded server of the state dir (--state-dir,
GPUAAS_STATE_DIR, `.gpuaas/` by default) is started on first use and reused.
The environment is read through reconciler.settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from reconciler import codes as reconciler_codes
from reconciler import settings
from reconciler.store import embedded
from schemas import dberrors
from schemas.errors import PermanentError

Connection = psycopg.Connection[TupleRow]


def state_dir(explicit: Path | None = None) -> Path:
    return explicit if explicit is not None else settings.current().state_dir


def external_url() -> str | None:
    return settings.current().database_url


NOT_RUNNING = reconciler_codes.DB_NOT_RUNNING  # a read-only command found no embedded server: it never starts one


def database_url(explicit_url: str | None = None, state: Path | None = None, *, start: bool = True) -> str:
    """The URL to use: an explicit one, $GPUAAS_DATABASE_URL, or the embedded server's.

    start=False (read-only commands: status, history, drift, usage): an
    embedded server that is not running is an error saying how to start one,
    never a server started and left running behind a command that only reads.
    """
    url = explicit_url or external_url()
    if url:
        return url
    where = state_dir(state)
    if start:
        return embedded.ensure(where).url()
    server = embedded.server_for(where)
    if not embedded.running(server):
        how = "gpuaas db start" + ("" if state is None else f" --state-dir {where}")
        was = "stopped" if server.initialized else "never initialised"
        raise PermanentError(
            f"no database server runs for the state dir {where} ({was}); this command only "
            f"reads and starts none: start it with `{how}`, or set {settings.ENV_URL} (or --db-url)",
            code=NOT_RUNNING,
        )
    return server.url()


def connect(url: str, *, autocommit: bool = False, **kwargs: Any) -> Connection:
    kwargs.setdefault("application_name", "gpuaas")
    kwargs.setdefault("connect_timeout", 10)
    with dberrors.wrapped("connect to PostgreSQL"):
        return psycopg.connect(url, autocommit=autocommit, **kwargs)
