"""Read-only connections for the service: a `psycopg_pool` pool, one read-only transaction per use.

Every session is opened with `default_transaction_read_only = on` and every
use runs in `REPEATABLE READ, READ ONLY`: one consistent snapshot per request,
and the database itself refuses a write, whatever a bug asks for. The pool
checks a connection before handing it out (`check_connection`), so one that
broke with its server is replaced, not used; a pool that cannot hand out a
connection in time fails the request with `db.unavailable`.

A pool that just failed to hand one out waits only `down_wait_s` (default 1 s)
until a connection is handed out again: while the database is down, /readyz,
/metrics and the API answer 503 or `gpuaas_database_up 0` in about a second,
not after the whole wait each (a probe or a scrape times out at 1-10 s and
would then report nothing at all). Its connection attempts go on in the
background, so the first request after the database is back still gets one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg_pool
from psycopg import conninfo

from reconciler.store import connections
from schemas import dberrors

READ_ONLY_OPTIONS = "-c default_transaction_read_only=on"
# No JIT in the service's sessions (as in the loop's): the fleet-wide aggregates of the dashboard and
# /metrics pass jit_above_cost on their estimates, and PostgreSQL compiled them again on every request
# (the dashboard's slot overview at 10,000 nodes: 0.3 s of compiling for 0.1 s of work).
NO_JIT_OPTIONS = "-c jit=off"
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"


def session_kwargs(
    url: str, *, read_only: bool, statement_timeout_ms: int, connect_timeout: int, application_name: str
) -> dict[str, Any]:
    """Connection keyword arguments: the URL's own options plus ours (read-only, statement timeout)."""
    params = conninfo.conninfo_to_dict(url)
    extra = (
        READ_ONLY_OPTIONS if read_only else None,
        NO_JIT_OPTIONS,
        f"-c statement_timeout={int(statement_timeout_ms)}",
    )
    options = " ".join(str(o) for o in (params.get("options"), *extra) if o)
    return {
        "options": options,
        "connect_timeout": connect_timeout,
        "application_name": application_name,
        "autocommit": True,
    }


class Pool:
    def __init__(
        self,
        url: str,
        *,
        size: int = 8,
        statement_timeout_ms: int = 30_000,
        connect_timeout: int = 5,
        wait_timeout_s: float = 5.0,
        down_wait_s: float = 1.0,
    ) -> None:
        self.wait_timeout_s = wait_timeout_s
        self.down_wait_s = min(down_wait_s, wait_timeout_s)
        self._down = False  # set by a failure to hand out a connection, cleared by the next one handed out
        kwargs = session_kwargs(
            url,
            read_only=True,
            statement_timeout_ms=statement_timeout_ms,
            connect_timeout=connect_timeout,
            application_name="gpuaas-serve",
        )
        # min_size 0: a command that reads once (`gpuaas usage`) opens one connection, not a warm pool.
        self._pool: psycopg_pool.ConnectionPool[connections.Connection] = psycopg_pool.ConnectionPool(
            url,
            min_size=0,
            max_size=max(1, size),
            kwargs=kwargs,
            open=True,
            timeout=wait_timeout_s,
            check=psycopg_pool.ConnectionPool.check_connection,
            name="gpuaas-serve-read",
            max_idle=300.0,
        )

    @property
    def size(self) -> int:
        return self._pool.max_size

    def stats(self) -> dict[str, int]:
        return dict(self._pool.get_stats())

    @property
    def down(self) -> bool:
        """True from a failure to hand out a connection until one is handed out again."""
        return self._down

    @contextlib.contextmanager
    def reading(self, *, wait_s: float | None = None) -> Iterator[connections.Connection]:
        """A connection inside a read-only, repeatable-read transaction (rolled back at the end).

        `wait_s` bounds the wait for a connection (default: the pool's, or `down_wait_s` while down).
        """
        if wait_s is None:
            wait_s = self.down_wait_s if self._down else self.wait_timeout_s
        try:
            cm = self._pool.connection(timeout=wait_s)
            conn = cm.__enter__()
        except psycopg_pool.PoolTimeout as e:
            self._down = True
            raise dberrors.DatabaseUnavailable(f"start a read-only transaction: {e}") from e
        except psycopg.Error as e:
            self._down = True
            raise dberrors.translate(e, "start a read-only transaction") from e
        self._down = False
        try:
            with dberrors.wrapped("start a read-only transaction"):
                conn.execute(_BEGIN)
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
            cm.__exit__(None, None, None)

    def close(self) -> None:
        """Close the pool; connections in use are closed when given back."""
        self._pool.close(timeout=5.0)
