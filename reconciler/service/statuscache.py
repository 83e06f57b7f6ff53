"""The status document, computed in the background and cached by database snapshot.

The document is exactly `gpuaas status -o json`'s: both call
`reconciler.reports.status.document`. What differs is when it is computed. Rebuilding the model reads and
validates the whole inventory and runs the planner's engine until every
size is refused: milliseconds for a small fleet, tens of seconds at 10,000
nodes. So:

- a computed document is keyed by the PostgreSQL snapshot it was read in
  (`pg_current_snapshot()`: it changes whenever any write commits), and is
  served as long as the key is unchanged;
- when the key changed, one background thread recomputes (never two at
  once, and not more often than `refresh_s`); a request waits up to
  `wait_s` for it, then gets the previous document marked `stale` (at once
  when the previous computation took longer than what is left of the wait,
  and, unless the caller names a wait, when the previous document is the
  kept one of a restart);
- before the first document exists a request waits up to `wait_s`, then
  gets `api.capacity_computing` (503, Retry-After);
- kept (`keep_in`), each computed document is kept on disk and a restarted
  service starts from the kept one (current when nothing committed since,
  else stale until the fresh one is computed) when the inventory generation
  is unchanged (`keptcapacity`).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desired.reading import loading
from reconciler import codes as reconciler_codes
from reconciler.reports import status
from reconciler.service import keptcapacity
from reconciler.service.pool import Pool
from reconciler.store.connections import Connection
from schemas.errors import GpuaasError, PermanentError, TemporaryError

# How long the start waits for a connection to load the kept document: a database that is down must not
# hold back the listening socket (and /healthz) for the pool's whole wait; capacity is computed once it is back.
_WARM_WAIT_S = 2.0


class CapacityComputing(TemporaryError):
    code = reconciler_codes.API_CAPACITY_COMPUTING


@dataclass(frozen=True, slots=True)
class Computed:
    key: str  # the snapshot the document was read in
    doc: dict[str, Any]  # the `gpuaas status -o json` document
    as_of: dt.datetime
    seconds: float  # how long computing it took
    kept: bool = False  # loaded from the kept copy at start, not computed by this process


@dataclass(frozen=True, slots=True)
class Answer:
    computed: Computed
    stale: bool  # the store changed since (a newer document is being computed)


def snapshot_key(conn: Connection) -> str:
    row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    return str(row[0]) if row else ""


def status_document(conn: Connection, *, policy: str | None = None) -> dict[str, Any]:
    """The status document (`reconciler.reports.status.document`) read on `conn`, in one transaction."""
    return status.document(conn, policy=policy)


class Cache:
    def __init__(
        self,
        pool: Pool,
        *,
        policy: str | None = None,
        refresh_s: float = 10.0,
        wait_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pool = pool
        self._kept: tuple[Path | None, str] | None = None  # (cache dir, database url) from `keep_in`
        self._policy = policy
        self.refresh_s = refresh_s
        self.wait_s = wait_s
        self._clock = clock
        self._cond = threading.Condition()
        self._current: Computed | None = None
        self._running = False
        self._started_at = float("-inf")
        self._error: GpuaasError | None = None
        self._thread: threading.Thread | None = None

    def keep_in(self, url: str, directory: Path | None = None) -> None:
        """Keep each computed document of database `url` in the cache store under `directory` (default:
        the user's, `cachestore.default_dir`), and start from the kept one (`warm`)."""
        self._kept = (directory, url)

    def _compute(self) -> None:
        done: Computed | None = None
        ident = (0, 0)
        try:
            t0 = time.perf_counter()
            with self._pool.reading() as conn, loading.collector_paused():  # millions of live objects at 10k
                key = snapshot_key(conn)
                ident = keptcapacity.identity(conn)
                doc = status_document(conn, policy=self._policy)
            done = Computed(key, doc, dt.datetime.now(dt.UTC), time.perf_counter() - t0)
            with self._cond:
                self._current, self._error = done, None
        except GpuaasError as e:
            with self._cond:
                self._error = e
        except Exception as e:  # a bug must not leave waiters hanging; it is reported to them
            with self._cond:
                self._error = PermanentError(f"computing capacity failed: {e!r}", code=reconciler_codes.API_INTERNAL)
        finally:
            with self._cond:
                self._running = False
                self._cond.notify_all()
        if done is not None and self._kept is not None:  # after the waiters were answered
            keptcapacity.save(
                *self._kept,
                self._policy,
                ident=ident,
                snapshot=done.key,
                as_of=done.as_of,
                seconds=done.seconds,
                doc=done.doc,
            )

    def _kick(self, key: str | None) -> None:
        """Start a recompute unless one runs, the current one is fresh, or the last started too recently."""
        cur = self._current
        if self._running or (cur is not None and cur.key == key):
            return
        if cur is not None and self._clock() - self._started_at < self.refresh_s:
            return
        self._running = True
        self._started_at = self._clock()
        self._thread = threading.Thread(target=self._compute, name="gpuaas-capacity", daemon=True)
        self._thread.start()

    def get(self, *, wait_s: float | None = None) -> Answer:
        """The newest document; see the module docstring for when it waits and when it is stale."""
        with self._pool.reading() as conn:
            key = snapshot_key(conn)
        wait = self.wait_s if wait_s is None else wait_s
        with self._cond:
            self._kick(key)
            cur = self._current
            # A kept document is served at once after a restart (that is what keeping it is for):
            # its recorded time is another process's, and a fresh process's first computation runs
            # cold, so waiting on it made a restart after any commit take the whole wait (2.7 s at
            # 10k). A caller that names its own wait still gets it.
            patient = wait_s is not None or cur is None or not cur.kept
            if patient and self._running and (cur is None or cur.key != key):
                # Not when the last computation says this one cannot end within the wait (10,000
                # nodes: tens of seconds): the previous document now, not the same one 2 s later.
                left = cur.seconds - (self._clock() - self._started_at) if cur is not None else 0.0
                if left <= wait:
                    self._cond.wait_for(lambda: not self._running, timeout=wait)
            cur = self._current
            if cur is None:
                if self._error is not None and not self._running:
                    raise self._error
                raise CapacityComputing(
                    "capacity is still being computed for the first time; retry shortly", delay=max(1.0, self.wait_s)
                )
            return Answer(cur, stale=cur.key != key)

    def peek(self, conn: Connection | None = None) -> Answer | None:
        """The newest document without waiting (metrics, dashboard); starts a refresh when the store changed.

        `conn`: read the store's snapshot in that transaction (a scrape's own) rather than in one of its own.
        """
        if conn is not None:
            key = snapshot_key(conn)
        else:
            with self._pool.reading() as own:
                key = snapshot_key(own)
        with self._cond:
            self._kick(key)
            cur = self._current
            return None if cur is None else Answer(cur, stale=cur.key != key)

    def warm(self) -> None:
        """Start computing; first load the kept document, if any is current (see `keptcapacity`)."""
        if self._kept is not None and self._current is None:
            try:
                with (
                    self._pool.reading(wait_s=_WARM_WAIT_S) as conn,
                    loading.collector_paused(),
                ):  # decoding 10,000 nodes: 0.36 s, with GC 3.4 s
                    kept = keptcapacity.load(*self._kept, self._policy, conn)
            except GpuaasError:  # the database is not there yet: /readyz says so, the service still starts
                kept = None
            if kept is not None:
                with self._cond:
                    if self._current is None:
                        self._current = Computed(*kept, kept=True)
        with self._cond:
            self._kick(None)

    def join(self, timeout: float | None = None) -> None:
        """Wait for a computation in flight (shutdown: its connection is closed when it ends)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
