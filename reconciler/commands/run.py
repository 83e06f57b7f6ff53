"""`gpuaas run [PATH] [--interval S] [--remote NAME --branch B] [--once]`: the GitOps loop.

Without --remote: watch the local checkout PATH and reconcile its committed
HEAD on every commit (the working tree is never read: commit to apply).
With --remote/--branch: fetch that branch every --interval seconds into the
clone at PATH and reconcile the fetched commit. Either way pending work is
retried every --interval seconds, every reconciliation is recorded (see
`gpuaas history`), and SIGTERM or SIGINT finishes the reconciliation in
progress and exits 0. A database that is down at start-up is waited for,
as it is later. With --max-failing-seconds S the process exits 3 once it has
failed for longer than S (so a supervisor sees a loop that cannot make
progress). An empty database (no schema: a fresh one, or one re-created
under the loop) is migrated; with --no-migrate the process exits 4 instead
(`gitops.no_schema`), never retrying "relation does not exist" forever.
See reconciler/loop/watching.py (the loop) and reconciler/loop/heads.py (the revision sources) for
the rules. `--log-format json` (or GPUAAS_LOG_FORMAT=json) prints each line as one JSON object (schemas/logs.py).
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import logs, notify, signals
from schemas.errors import UsageError

if TYPE_CHECKING:
    from reconciler.loop import watching

log = logging.getLogger("gpuaas.run")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="the reconciler loop: watch a checkout or poll a remote branch")
    p.add_argument("path", nargs="?", default=Path("."), type=Path, help="desired-state checkout (default .)")
    p.add_argument(
        "--interval",
        type=float,
        default=30.0,
        help="seconds between retries of pending work (and between remote polls); default 30",
    )
    p.add_argument("--remote", help="poll this remote (with --branch) instead of watching the checkout")
    p.add_argument("--branch", help="branch of --remote to reconcile")
    p.add_argument("--once", action="store_true", help="reconcile the current revision (and retry), then exit")
    p.add_argument("--debounce-ms", type=int, default=200, help="watch mode: group file events (default 200)")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    p.add_argument(
        "--max-failing-seconds",
        type=float,
        metavar="S",
        help="exit 3 when every try has failed for longer than S seconds (default: never give up)",
    )
    p.add_argument(
        "--no-migrate",
        action="store_true",
        help="never migrate the schema: exit 4 when the database lacks it (default: migrate)",
    )
    p.add_argument("--log-format", choices=logs.FORMATS, help="log lines (default $GPUAAS_LOG_FORMAT or text)")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _log(text: str, event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    log.log(level, text, extra={"event": event, **fields})


# What each loop event is worth to an operator reading the log.
_EVENT_LEVELS = {
    "invalid": logging.WARNING,
    "behind": logging.WARNING,
    "migrated": logging.WARNING,
    "error": logging.ERROR,
}


def _log_event(e: watching.Event) -> None:
    fields = {
        "revision": e.revision,
        "run_id": e.run_id,
        "counts": dict(e.counts),
        "seconds": round(e.seconds, 3),
        "changed": e.changed,
    }
    _log(e.render(), f"reconcile.{e.kind}", level=_EVENT_LEVELS.get(e.kind, logging.INFO), **fields)


def stop_on_signals(stop: threading.Event) -> AbstractContextManager[threading.Event]:
    """SIGTERM and SIGINT set `stop` (the loop finishes its reconciliation, then returns)."""
    return signals.stop_on(
        stop, on_first=lambda sig: _log(f"{sig.name}: finishing the current reconciliation, then exiting", "run.signal")
    )


def _check(args: argparse.Namespace) -> None:
    if bool(args.remote) != bool(args.branch):
        raise UsageError("--remote and --branch go together")
    if args.interval <= 0:
        raise UsageError("--interval must be positive")
    if args.max_failing_seconds is not None and args.max_failing_seconds <= 0:
        raise UsageError("--max-failing-seconds must be positive")
    if args.remote:
        from desired.reading import gitrepo

        try:
            gitrepo.check_ref_name(args.remote, "--remote")
            gitrepo.check_ref_name(args.branch, "--branch")
        except gitrepo.RefNameError as e:
            raise UsageError(str(e), code=e.code) from e
    if args.policy:
        from policies import packing

        try:
            packing.Policy(args.policy)
        except ValueError as e:
            raise UsageError(
                f"unknown placement policy {args.policy!r}", code=reconciler_codes.PLAN_POLICY_UNKNOWN
            ) from e


GAVE_UP = 3  # exit status: failing for longer than --max-failing-seconds
NO_SCHEMA = 4  # exit status: --no-migrate and the database lacks (part of) the schema


def _migrate_when_up(
    url: str, stop: threading.Event, interval: float, max_failing_s: float | None, *, migrate: bool = True
) -> int | None:
    """Migrate once the database answers; wait and retry while it does not.

    None: migrated (or, with migrate=False, found current). Else the exit
    status: 0 stopped first, GAVE_UP unreachable for longer than
    max_failing_s (the loop gives up the same way once running), NO_SCHEMA.
    """
    from reconciler.store import connections, migrations
    from schemas.errors import TemporaryError

    delay, since = 1.0, time.monotonic()
    while not stop.is_set():
        try:
            with connections.connect(url, autocommit=True) as conn:
                if migrate:
                    migrations.migrate(conn)
                    return None
                done = migrations.applied(conn)
            pending = [m.version for m in migrations.available() if m.version not in done]
            if not pending:
                return None
            _log(
                f"gitops.no_schema: the database lacks {len(pending)} migration(s) ({', '.join(pending[:3])}"
                f"{', ...' if len(pending) > 3 else ''}) and --no-migrate is set; run `gpuaas db migrate`",
                "run.no_schema",
                level=logging.ERROR,
                code=reconciler_codes.GITOPS_NO_SCHEMA,
            )
            return NO_SCHEMA
        except TemporaryError as e:
            failing = time.monotonic() - since
            if max_failing_s is not None and failing > max_failing_s:
                _log(
                    f"the database has been unreachable for {failing:.0f}s (over {max_failing_s:g}s), "
                    f"last {e.code}: {e.message}; exiting",
                    "run.gave_up",
                    level=logging.ERROR,
                    code=e.code,
                )
                return GAVE_UP
            _log(
                f"waiting for the database: {e.code}: {e.message} (next try in {delay:g}s)",
                "run.db_waiting",
                level=logging.WARNING,
                code=e.code,
            )
            stop.wait(delay)
            delay = min(delay * 2, max(interval, 1.0))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
        # stdout and no level in text: the lines `gpuaas run` has always printed.
        with logs.configured(logs.choose(args.log_format), stream="stdout", text="%(asctime)s %(message)s"):
            return _run(args)
    except signals.Terminated:
        # SIGTERM before the loop's own handling was installed (or after it was removed): nothing
        # was started or is left half-done, so this is the clean stop a supervisor asked for.
        return 0


def _run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    with stop_on_signals(stop):  # first: a SIGTERM during start-up is a clean stop too
        from reconciler.loop import heads, watching
        from reconciler.store import connections

        url = db.database_url(args)
        early = _migrate_when_up(url, stop, args.interval, args.max_failing_seconds, migrate=not args.no_migrate)
        if early is not None:
            if early == 0:
                _log("stopped", "run.stopped")
            return early
        source: watching.Revisions
        if args.remote:
            source = heads.RemoteBranch(args.path, args.remote, args.branch, stop, retry_delay=args.interval)
        else:
            source = heads.LocalHead(args.path, stop, debounce_ms=args.debounce_ms)
        _log(
            f"gpuaas run: {source.label}, retry every {args.interval:g}s" + (" (once)" if args.once else ""),
            "run.started",
        )
        loop = watching.Loop(
            args.path,
            source,
            lambda: connections.connect(url, autocommit=True),
            stop=stop,
            interval=args.interval,
            policy=args.policy,
            log=_log_event,
            max_failing_s=args.max_failing_seconds,
            migrate=not args.no_migrate,
        )
        try:
            with notify.serving(f"watching {source.label}"):  # systemd Type=notify: READY=1, then the watchdog
                last = loop.run(once=args.once)
        finally:
            source.close()
    if loop.gave_up:
        return GAVE_UP
    if loop.no_schema:
        return NO_SCHEMA
    if stop.is_set():
        if loop.failing is not None:
            _log(
                f"stopped while failing for {loop.failing_for():.0f}s: {loop.failing.code}",
                "run.stopped",
                code=loop.failing.code,
            )
        else:
            _log("stopped", "run.stopped")
    if args.once and last is not None and last.kind in ("invalid", "error"):
        return 1
    return 0
