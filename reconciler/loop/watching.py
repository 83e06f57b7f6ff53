"""The GitOps loop: reconcile each new committed revision once, retry what waits, record everything.

Where revisions come from: `Revisions`, implemented by reconciler/loop/heads.py
(`LocalHead`, `RemoteBranch`).

What the loop does with a revision (`Loop.step`):

- a new revision is applied once: under the revision's advisory lock, unless
  the history shows that some reconciler already applied it (or refused it
  as invalid), or it is an ancestor of the newest applied revision (a stale
  clone must not roll the fleet back). An invalid revision is recorded as an
  error with every FILE:LINE problem and the last valid revision stays in
  force, as in Flux;
- every `interval` seconds, the current revision is reconciled again when
  something may move: an allocation waits and the pure plan would now place
  or release something (capacity freed), or claims wait for hosts and a host
  reported since our last run (VM ready, wipe proof). Nothing to do records
  nothing;
- every reconciliation is one row in `reconciliations` (history module);
- HEAD moved back (a force-push or a rollback of the branch to an ancestor
  of the applied revision) is refused, recorded once in the history
  (`gitops.head_behind`) and the applied revision stays in force;
- the store moved under the loop: every `interval` the loop compares the
  store's newest applied revision with the one it applied. Older (a restore
  from backup, another writer applying an ancestor) or none (a truncated
  history): the revision in force is applied again at once, with fresh
  caches (`gitops.reconverged`). Newer, or unknown to this clone: another
  reconciler is ahead, left alone. A database without the schema (an empty
  one) is migrated, or with `migrate=False` the loop returns with
  `no_schema` set, never a retry forever.

Stopping: `stop` (a threading.Event, set by SIGTERM/SIGINT in the command)
is checked between steps; a reconciliation in progress finishes its
transactions first, then the loop returns.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import psycopg

from desired.reading import loading
from desired.reading.loading import Cancelled
from desired.state import DesiredState, LoadResult
from policies import validationmemo
from reconciler import codes as reconciler_codes
from reconciler import sources
from reconciler.caches.blobs import BlobCache
from reconciler.loop import beside, heaps
from reconciler.loop.looptypes import Event, Failing, Revisions
from reconciler.placement import replanning
from reconciler.plans import Planner
from reconciler.reconcile import reconciling
from reconciler.store import connections, history, inventory, live, migrations, revisions
from schemas import dberrors
from schemas.errors import GpuaasError, TemporaryError

# The loop's values live in looptypes; callers and tests name them through this module.
__all__ = [
    "BUSY_RECHECK_S",
    "FRESH_RETRY_S",
    "HEAD_BEHIND",
    "NO_SCHEMA",
    "RECONVERGED",
    "Connect",
    "Event",
    "Failing",
    "Log",
    "Loop",
    "Revisions",
]

BUSY_RECHECK_S = 1.0  # another reconciler holds the revision: look again this soon
HEAD_BEHIND = reconciler_codes.GITOPS_HEAD_BEHIND  # HEAD is an ancestor of the applied revision: refused
RECONVERGED = reconciler_codes.GITOPS_RECONVERGED  # the store was behind the applied revision: applied again
NO_SCHEMA = reconciler_codes.GITOPS_NO_SCHEMA  # the database lost its schema: migrated, or the loop stops
_SCHEMA_GONE = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction)  # worth a look for the schema


Connect = Callable[[], connections.Connection]
Log = Callable[[Event], None]

FRESH_RETRY_S = 1.0  # a new failure is retried this soon, on a fresh connection
Check = Callable[[], object] | None  # raises when the state breaks the rules (beside.rules)


class Loop:
    """The reconciler loop over one source of revisions and one database."""

    def __init__(
        self,
        path: Path,
        source: Revisions,
        connect: Connect,
        *,
        stop: threading.Event,
        interval: float = 30.0,
        policy: str | None = None,
        log: Log | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_failing_s: float | None = None,
        migrate: bool = True,
    ) -> None:
        self.path, self.source, self.connect = path, source, connect
        self.stop, self.interval, self.policy = stop, interval, policy
        self.log = log or (lambda _e: None)
        self.clock = clock
        self.conn: connections.Connection | None = None
        self.seen: str | None = None  # last revision handled (applied, refused or skipped)
        self.state: DesiredState | None = None  # the valid desired state in force
        self.in_force: str | None = None  # the revision of `state` (what the store should be at)
        self.migrate = migrate  # an empty database: migrate it (else stop with no_schema set)
        self.no_schema = False
        self.last_started: dt.datetime | None = None  # our last reconciliation's start (DB clock)
        self.next_retry = clock() + interval
        self.not_before = 0.0  # back-off after an error or a busy revision
        self.attempting: str | None = None  # the revision the current step works on
        self.failing: Failing | None = None
        self.max_failing_s = max_failing_s
        self.gave_up = False  # failing for longer than max_failing_s: run() returned
        self.heap = heaps.Heap(clock)  # the state in force frozen, its garbage collected when idle (heaps)
        # parsed documents by git blob id, and the last tree: a commit re-reads only what it changed;
        # no plain values kept beside the models (positions come from the bytes)
        self.blobs = BlobCache(keep_values=False)
        self.inventory = inventory.Memory()  # rows the last sync wrote: a commit re-syncs only what it changed
        # the last observed claims and host facts: a commit re-reads only allocations and nodes it changed
        self.observed = live.Memory()
        self.checks = validationmemo.Memo()  # cross-file problems per document: a commit re-checks only what it changed
        # the placement engine of the last plan, reset per changed node: a commit re-plans at O(change)
        self.plans = replanning.WarmPlanner(policy)

    # -------------------------------------------------------------- plumbing

    def _conn(self) -> connections.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = self._session()
        return self.conn

    def _session(self) -> connections.Connection:  # also a cold apply's second one, for host plans
        conn = self.connect()
        # A commit's statements are short, but at 100,000 nodes the estimated cost of some passes
        # jit_above_cost, and every execution was compiled again (silent nodes: 46 ms a commit).
        with dberrors.wrapped("configure the loop's session"):
            conn.execute("SET jit = off")
            if not conn.autocommit:
                conn.commit()
        return conn

    def close(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.close()
        self.conn = None
        self.observed.forget()  # a new session reads everything again (the memory checks that too)

    def _emit(self, event: Event) -> Event:
        self.log(event)
        return event

    def _planner(self) -> Planner:
        return self.plans

    # ------------------------------------------------------------------ step

    def step(self) -> Event | None:
        """Handle a new revision, or retry the current one when due. Never raises (a stop returns None)."""
        now = self.clock()
        if now < self.not_before:
            return None
        self.attempting = self.seen
        event: Event | None
        try:
            rev = self.source.current()
            if rev is not None and rev != self.seen:
                self.attempting = rev
                event = self._new_revision(rev)
            elif now >= self.next_retry:
                self.next_retry = now + self.interval
                event = self._retry()
            elif (
                self.inventory.refresh_due() or self.plans.rebuild_due()
            ) and now - self.heap.settled_at >= heaps.IDLE_S:
                event = self._retry(periodic=True)  # the periodic full work, while no commit waits
            else:
                return None
        except Cancelled:
            return None  # stopping in the middle of a parse: nothing was written
        except GpuaasError as e:
            return self._error(e)
        except Exception as e:  # a bug must neither kill nor wedge the loop: logged, retried, counted as failing
            return self._failed(reconciler_codes.GPUAAS_BUG, f"{type(e).__name__}: {e}", None)
        self.failing = None  # the step went through: whatever failed before works again
        return event

    def _error(self, e: GpuaasError) -> Event:
        if isinstance(e, dberrors.DatabaseError) and isinstance(e.__cause__, _SCHEMA_GONE) and self._schema_missing():
            return self._no_schema()
        return self._failed(e.code, e.message, e.delay if isinstance(e, TemporaryError) else None)

    def _failed(self, code: str, message: str, delay: float | None) -> Event:
        """Back off after a failure. The session that failed is never reused: whatever state it
        cached (prepared statements, PL/pgSQL plans, an aborted transaction) goes with it, and the
        first failure of a code on a revision is retried at once on a fresh connection."""
        self.close()
        now, rev, before = self.clock(), self.attempting, self.failing
        same = before is not None and (before.revision, before.code) == (rev, code)
        tries = before.tries + 1 if same and before is not None else 1
        since = before.since if before is not None else now
        self.failing = Failing(rev, code, message, since, tries)
        wait = FRESH_RETRY_S if tries == 1 else min(self.interval, FRESH_RETRY_S * 2 ** (tries - 1))
        self.not_before = now + max(wait, delay or 0.0)
        self.next_retry = min(self.next_retry, self.not_before)  # a failed retry is tried again, too
        note = (
            "retrying on a fresh connection"
            if tries == 1
            else f"failing for {now - since:.0f}s, try {tries}, next in {self.not_before - now:.0f}s"
        )
        return self._emit(Event("error", rev, f"{code}: {message} ({note})"))

    def failing_for(self) -> float:
        return 0.0 if self.failing is None else self.clock() - self.failing.since

    def _new_revision(self, rev: str) -> Event:
        conn = self._conn()
        with revisions.try_lock(conn, rev) as mine:
            if not mine:
                self.not_before = self.clock() + BUSY_RECHECK_S
                return self._emit(Event("skipped", rev, "another reconciler is applying this revision"))
            latest = revisions.latest_applied(conn)
            if latest is not None and self.source.is_ancestor(rev, latest):
                return self._behind(conn, rev, latest)
            who = revisions.applied_by(conn, rev)
            if who is not None:
                self._adopt(rev)
                return self._emit(Event("skipped", rev, f"already applied by {who}"))
            who = revisions.refused_by(conn, rev)
            if who is not None:
                self.seen = rev
                return self._emit(Event("skipped", rev, f"already refused by {who}"))
            return self._apply(conn, rev)

    def _behind(self, conn: connections.Connection, rev: str, latest: str) -> Event:
        """HEAD is an ancestor of the applied revision: refused (recorded once), the applied one stays."""
        self.seen = rev
        if self.in_force != latest:  # a fresh loop: retries work on the revision in force
            self._adopt(latest, seen=False)
        message = (
            f"{self.source.label} moved back to {rev[:12]}, an ancestor of the applied revision "
            f"{latest[:12]} (a force-push or a rollback); {latest[:12]} stays in force. Push a newer "
            "commit, or apply an older one on purpose with `gpuaas apply`"
        )
        run_id = None
        if revisions.refused_by(conn, rev) is None:
            run_id = history.start(conn, revision=rev, source=f"{revisions.APPLY_SOURCE} {self.source.label}")
            history.finish(
                conn,
                run_id,
                result="error",
                counts={revisions.BEHIND_COUNT: 1},
                problems=[{"code": HEAD_BEHIND, "message": message}],
            )
        return self._emit(Event("behind", rev, f"{HEAD_BEHIND}: {message}", run_id))

    def _adopt(self, rev: str, *, seen: bool = True) -> None:
        """Take over a revision another reconciler applied: its state is ours for retries."""
        loaded = sources.load(self.path, rev, cancel=self.stop.is_set, cache=self.blobs, memo=self.checks)
        if seen:
            self.seen = rev
        if not loaded.errors:
            self.state, self.in_force = loaded.state, rev

    # Paused from the read to the apply: re-enabled between them, the collector walked the whole new tree.
    @loading.collector_paused()
    def _apply(self, conn: connections.Connection, rev: str) -> Event:
        t0 = time.perf_counter()
        parsed = sources.parse(self.path, rev, cancel=self.stop.is_set, cache=self.blobs)
        if parsed.delta is None and not parsed.problems:  # read whole: the rules run while the sync waits (beside)
            with beside.rules(parsed, self.checks.validate) as passed:
                try:
                    return self._reconcile(conn, rev, parsed, t0, checked=passed)
                except beside.Broken as e:
                    return self._invalid(conn, rev, e.loaded, t0, e.run_id)
        loaded = sources.checked(parsed, self.checks.validate)
        return self._invalid(conn, rev, loaded, t0) if loaded.errors else self._reconcile(conn, rev, loaded, t0)

    def _invalid(
        self, conn: connections.Connection, rev: str, loaded: LoadResult, t0: float, run_id: int | None = None
    ) -> Event:
        """Refuse a revision that breaks the rules: recorded once in history (`run_id`: already), nothing applied."""
        if run_id is None:
            run_id = beside.refused(conn, rev, f"{revisions.APPLY_SOURCE} {self.source.label}", loaded)
        self.seen = rev
        first = loaded.errors[0].render()
        message = f"{len(loaded.errors)} validation error(s), first: {first}; the last valid revision stays in force"
        return self._emit(Event("invalid", rev, message, run_id, seconds=time.perf_counter() - t0))

    def _reconcile(
        self, conn: connections.Connection, rev: str, loaded: LoadResult, t0: float, checked: Check = None
    ) -> Event:
        # A failure is recorded in history by reconcile itself; step() backs off and retries.
        try:
            result = reconciling.reconcile(
                conn,
                loaded.state,
                source=f"{revisions.APPLY_SOURCE} {self.source.label}",
                planner=self._planner(),
                memory=self.inventory,
                observed=self.observed,
                delta=loaded.delta,
                connect=self._session,
                checked=checked,
            )
        except beside.Broken:
            raise
        except reconciling.Invalid as e:  # an edit of a held allocation: refused (and recorded) like invalid YAML
            self.seen, message = rev, f"{e.message}; the last valid revision stays in force"
            return self._emit(Event("invalid", rev, message, seconds=time.perf_counter() - t0))
        self.seen, self.state, self.in_force = rev, loaded.state, rev
        self.heap.settle(whole=loaded.delta is None)
        self.last_started = revisions.started_at(conn, result.run_id)
        self.next_retry = self.clock() + self.interval
        counts = MappingProxyType(result.counts())
        return self._emit(Event("applied", rev, "", result.run_id, counts, time.perf_counter() - t0, result.changed))

    def _retry(self, *, periodic: bool = False) -> Event | None:
        """The revision in force again, when something may move; `periodic`: for the memories' full work
        (`inventory.Memory.refresh_due`, `WarmPlanner.rebuild_due`: seconds at 10,000 nodes), while idle."""
        state, rev = self.state, self.in_force
        if state is None or rev is None:
            return None
        conn = self._conn()
        latest = revisions.latest_applied(conn)
        if latest != rev:
            # Older or none: the store moved back under us. Newer (not fetched yet here) or
            # unknown to this clone: another reconciler is ahead, never rolled back from here.
            moved_back = latest is None or self.source.is_ancestor(latest, rev)
            return self._reconverge(state, rev, latest) if moved_back else None
        work = revisions.work(conn, self.last_started)
        if not (work.any or periodic):
            return None
        if not (work.host_reports or periodic):
            plan = self.plans(state, live.observe(conn, self.observed))
            if not (plan.placements or plan.releases):
                return None
        t0 = time.perf_counter()
        with revisions.try_lock(conn, rev) as mine:
            if not mine:
                return None
            done = []
            if periodic and self.inventory.refresh_due():
                self.inventory.distrust()  # this sync reads and compares every row
                done.append("every inventory row compared")
            if periodic and self.plans.rebuild_due():
                self.plans.rebuild()
                done.append("placement engine built cold")
            result = reconciling.reconcile(
                conn,
                state,
                source=f"{revisions.RETRY_SOURCE} {self.source.label}",
                planner=self._planner(),
                memory=self.inventory,
                observed=self.observed,
                connect=self._session,
            )
        self.last_started = revisions.started_at(conn, result.run_id)
        return self._emit(
            Event(
                "retried",
                rev,
                f"{' and '.join(done)} while idle" if done else "",
                result.run_id,
                MappingProxyType(result.counts()),
                time.perf_counter() - t0,
                result.changed,
            )
        )

    def _reconverge(self, state: DesiredState, rev: str, latest: str | None) -> Event | None:
        """The store is behind the revision we applied (restored, truncated, rolled back by another
        writer): apply it again, from nothing. The caches describe rows that may no longer exist,
        and so may the session's prepared statements (a restore re-creates every table: "cached
        plan must not change result type"): a fresh session too."""
        t0 = time.perf_counter()
        self.close()
        conn = self._conn()
        with revisions.try_lock(conn, rev) as mine:
            if not mine:
                return None
            self.inventory = inventory.Memory()
            self.observed = live.Memory()
            self.plans = replanning.WarmPlanner(self.policy)
            result = reconciling.reconcile(
                conn,
                state,
                source=f"{revisions.APPLY_SOURCE} {self.source.label}",
                planner=self._planner(),
                memory=self.inventory,
                observed=self.observed,
                connect=self._session,
            )
        self.last_started = revisions.started_at(conn, result.run_id)
        if self.seen != rev:
            self.seen = None  # HEAD is refused (invalid, behind): handled again, so history says so again
        was = latest[:12] if latest else "no applied revision"
        return self._emit(
            Event(
                "applied",
                rev,
                f"{RECONVERGED}: the store was at {was} (restored, truncated or "
                f"rolled back by another writer); applied {rev[:12]} again",
                result.run_id,
                MappingProxyType(result.counts()),
                time.perf_counter() - t0,
                result.changed,
            )
        )

    def _schema_missing(self) -> bool:
        """After "relation does not exist": is the schema gone (an empty or re-created database)?
        Asked on a fresh session: the failed one may have had its own search_path."""
        self.close()
        try:
            return not migrations.applied(self._conn())
        except GpuaasError:
            self.close()
            return False  # cannot tell: the error is handled as any other

    def _no_schema(self) -> Event:
        if not self.migrate:
            self.no_schema = True  # run() returns: a supervisor sees it (gpuaas run exits 4)
            return self._emit(
                Event(
                    "error",
                    self.attempting,
                    f"{NO_SCHEMA}: the database has no schema and "
                    "migrating was turned off; run `gpuaas db migrate`, then start the loop again",
                )
            )
        try:
            ran = migrations.migrate(self._conn())
        except GpuaasError as e:  # no privilege, a changed migration: a failure like any other, retried
            return self._failed(e.code, e.message, e.delay if isinstance(e, TemporaryError) else None)
        self.next_retry = self.not_before = 0.0  # the revision in force is applied again at once (_retry)
        return self._emit(
            Event(
                "migrated",
                self.attempting,
                f"{NO_SCHEMA}: the database had no schema; applied migrations {', '.join(ran) or '(none left)'}",
            )
        )

    # ------------------------------------------------------------------- run

    def run(self, *, once: bool = False) -> Event | None:
        """Loop until `stop` is set; returns the last event.

        once=True handles the current revision, then retries it at once if
        something waits or it failed (what a cron job wants), and returns.
        With max_failing_s, a loop that has failed for longer than that
        returns with `gave_up` set, so a supervisor sees it (exit non-zero).
        """
        last: Event | None = None
        try:
            while not self.stop.is_set() and not self.no_schema:
                event = self.step()
                if event is None and not once:
                    self.heap.idle()  # nothing came: a due full collection delays no commit now
                last = event or last
                if once:
                    self.next_retry = self.not_before = 0.0
                    return last if self.no_schema else (self.step() or last)
                if (
                    self.max_failing_s is not None
                    and self.failing is not None
                    and self.failing_for() > self.max_failing_s
                ):
                    self.gave_up = True
                    f = self.failing
                    return self._emit(
                        Event(
                            "error",
                            f.revision,
                            f"failing for {self.failing_for():.0f}s "
                            f"(over {self.max_failing_s:g}s), last {f.code}: {f.message}; exiting",
                        )
                    )
                now = self.clock()
                deadline = min(self.next_retry, self.not_before) if self.not_before > now else self.next_retry
                self.source.wait(max(0.0, deadline - now))
        finally:
            self.close()
            sources.release(self.blobs)
        return last
