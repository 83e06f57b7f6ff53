"""Where the database is, and connecting to it.

GPUAAS_DATABASE_URL names an external PostgreSQL; without it the embedded
server of the state dir (GPUAAS_STATE_DIR, `.gpuaas/` by default) is started
on first use and reused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from reconciler.store import embedded
from schemas import dberrors

ENV_URL = "GPUAAS_DATABASE_URL"
ENV_STATE_DIR = "GPUAAS_STATE_DIR"
DEFAULT_STATE_DIR = Path(".gpuaas")

Connection = psycopg.Connection[TupleRow]


def state_dir(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    env = os.environ.get(ENV_STATE_DIR)
    return Path(env) if env else DEFAULT_STATE_DIR


def external_url() -> str | None:
    return os.environ.get(ENV_URL) or None


def database_url(explicit_url: str | None = None, state: Path | None = None) -> str:
    """The URL to use: an explicit one, $GPUAAS_DATABASE_URL, or the embedded server's."""
    url = explicit_url or external_url()
    if url:
        return url
    return embedded.ensure(state_dir(state)).url()


def connect(url: str, *, autocommit: bool = False, **kwargs: Any) -> Connection:
    kwargs.setdefault("application_name", "gpuaas")
    kwargs.setdefault("connect_timeout", 10)
    with dberrors.wrapped("connect to PostgreSQL"):
        return psycopg.connect(url, autocommit=autocommit, **kwargs)
