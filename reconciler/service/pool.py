"""Read-only connections for the service: a small pool, one read-only transaction per use.

Every session is opened with `default_transaction_read_only = on` and every
use runs in `REPEATABLE READ, READ ONLY`: one consistent snapshot per request,
and the database itself refuses a write, whatever a bug asks for. A
connection that broke (the server restarted) is dropped, and a fresh one is
tried once before the request fails with `db.unavailable`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import psycopg
from psycopg import conninfo
from psycopg.pq import TransactionStatus

from reconciler.store import connections
from schemas import dberrors

READ_ONLY_OPTIONS = "-c default_transaction_read_only=on"
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"


class Pool:
    def __init__(self, url: str, *, size: int = 8, statement_timeout_ms: int = 30_000,
                 connect_timeout: int = 5) -> None:
        params = conninfo.conninfo_to_dict(url)
        options = " ".join(str(o) for o in (params.get("options"), READ_ONLY_OPTIONS,
                                            f"-c statement_timeout={int(statement_timeout_ms)}") if o)
        self._url = url
        self._kwargs = {"options": options, "connect_timeout": connect_timeout,
                        "application_name": "gpuaas-serve"}
        self._size = size
        self._idle: list[connections.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> connections.Connection:
        return connections.connect(self._url, autocommit=True, **self._kwargs)

    def _get(self) -> tuple[connections.Connection, bool]:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and not conn.broken:
                    return conn, True
        return self._connect(), False

    def _put(self, conn: connections.Connection) -> None:
        healthy = not conn.closed and not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
        with self._lock:
            if healthy and not self._closed and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def _begin(self) -> connections.Connection:
        conn, pooled = self._get()
        try:
            conn.execute(_BEGIN)
        except psycopg.OperationalError as e:
            conn.close()
            if not pooled:
                raise dberrors.translate(e, "start a read-only transaction") from e
            conn = self._connect()  # the pooled one died with its server: one fresh try
            with dberrors.wrapped("start a read-only transaction"):
                conn.execute(_BEGIN)
        except psycopg.Error as e:
            conn.close()
            raise dberrors.translate(e, "start a read-only transaction") from e
        return conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[connections.Connection]:
        """A connection inside a read-only, repeatable-read transaction (rolled back at the end)."""
        conn = self._begin()
        try:
            yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
            self._put(conn)

    def close(self) -> None:
        """Close idle connections; connections in use are closed when given back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
