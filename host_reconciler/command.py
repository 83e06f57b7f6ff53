"""`gpuaas host converge` (one pass) and `gpuaas host run` (the loop).

    gpuaas host converge --node NAME [--dry-run] [--mode report|self-heal] [-o text|json]
    gpuaas host run --node NAME [--interval S] [--passes N] [--log-format text|json] [--metrics-listen HOST:PORT]

Both read the node's plan from `gpuaas serve` over HTTP(S) (--service URL
/ $GPUAAS_SERVICE_URL, the node's token in --credential FILE /
$GPUAAS_CREDENTIAL_FILE, made by `gpuaas host token issue NODE`; see
agentclient.py for what happens while the service is away) and write the
node's status back. Two lab modes remain: --plan-file (a host-plan JSON
document; the status goes to --status-file) and a direct database mode
(--db-url, as the node's own role: --db-role / $GPUAAS_HOST_DB_ROLE, password
in $GPUAAS_HOST_DB_PASSWORD), for a lab without a service only: a fleet's
hosts hold no database login. Host settings come from --config / $GPUAAS_HOST_CONFIG.
`--dry-run` prints the actions the pass would take and changes nothing.
`host run --log-format json` (or GPUAAS_LOG_FORMAT=json) logs one JSON object
per line, each with `node` (schemas/logs.py); `--metrics-listen` serves
/metrics and /healthz (host_reconciler/metrics.py; off by default).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host_reconciler import codes as host_codes
from schemas import environment, hostplans, logs, notify, output, signals
from schemas.errors import GpuaasError, PermanentError, UsageError

if TYPE_CHECKING:
    from host_reconciler import agentclient, converging, metrics, settings
    from host_reconciler.context import Drivers

ENV_SERVICE = "GPUAAS_SERVICE_URL"
ENV_CREDENTIAL = "GPUAAS_CREDENTIAL_FILE"
ENV_URL = environment.DATABASE_URL  # the same variable the central reconciler reads
ENV_ROLE = "GPUAAS_HOST_DB_ROLE"
ENV_PASSWORD = "GPUAAS_HOST_DB_PASSWORD"  # noqa: S105 -- the name of a variable, not a secret
# Seconds between heartbeats of `host run`: well under the fleet's liveness TTL
# (Fleet.host_liveness_ttl_seconds, default 90), also while one pass runs long.
HEARTBEAT_S = 15.0
PLAN_FILE_LIMIT = 64 * 1024 * 1024  # a host plan is kilobytes; a device or a wrong path is refused
# A pass loop that has not turned for this long is stuck: the watchdog stops vouching and systemd restarts the
# agent. Longer than any honest pass (a 64 GiB image pull on a slow link, a wipe of large disks).
_STUCK_S = 3600.0


def register(sub: Any) -> None:
    from host_reconciler import settings
    from host_reconciler.actions import DriftMode

    for name, helptext, fn in (
        ("converge", "one pass: observe, diff, act, report", run_converge),
        ("run", "converge in a loop (the host agent)", run_loop),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--node", required=True, help="this host's node name")
        p.add_argument("--config", type=Path, help=f"host settings JSON (default ${settings.ENV_CONFIG})")
        p.add_argument("--mode", choices=[m.value for m in DriftMode], help="drift mode (default: settings)")
        p.add_argument("--plan-file", type=Path, help="read the plan from this JSON file, not the database")
        p.add_argument("--status-file", type=Path, help="with --plan-file: write the status JSON here")
        p.add_argument("--service", metavar="URL", help=f"the control plane's URL (default ${ENV_SERVICE})")
        p.add_argument(
            "--credential",
            type=Path,
            metavar="FILE",
            help=f"this node's token file, mode 0600 (default ${ENV_CREDENTIAL})",
        )
        p.add_argument("--service-ca", type=Path, metavar="FILE", help="CA bundle to verify an https --service")
        p.add_argument("--db-url", help=f"lab mode without a service: PostgreSQL URL (default ${ENV_URL})")
        p.add_argument("--db-role", help=f"lab mode: the node's database role (default ${ENV_ROLE})")
        output.add_argument(p, "text")
        if name == "converge":
            p.add_argument("--dry-run", action="store_true", help="print the actions, change nothing")
        else:
            p.add_argument("--interval", type=float, help="seconds between passes (default: settings)")
            p.add_argument("--passes", type=int, default=0, help="stop after N passes (0: run until signalled)")
            p.add_argument("--log-format", choices=logs.FORMATS, help="log lines (default $GPUAAS_LOG_FORMAT or text)")
            p.add_argument(
                "--metrics-listen",
                metavar="HOST:PORT",
                help="serve /metrics and /healthz here, e.g. 127.0.0.1:9101 (default: not served)",
            )
            p.add_argument(
                "--metrics-allow-host",
                metavar="NAME",
                action="append",
                default=[],
                help="a Host name the metrics listener answers besides loopback names and the listen "
                "address (repeatable; * for any)",
            )
        p.set_defaults(func=fn)
    from host_reconciler import imagecommand

    imagecommand.register(sub)


class _Source:
    """Where the plan comes from and the status goes: the service, files, or (lab) the database."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.node: str = args.node
        self.plan_file: Path | None = args.plan_file
        self.status_file: Path | None = args.status_file
        self.conn: Any = None
        self.connect: Callable[[], Any] | None = None  # a new connection as this node (database lab mode)
        self.service: agentclient.ServiceSource | None = None
        if self.plan_file is not None:
            return
        service_url = getattr(args, "service", None) or os.environ.get(ENV_SERVICE)
        url = args.db_url or os.environ.get(ENV_URL)
        if service_url:
            from host_reconciler import agentclient

            credential = getattr(args, "credential", None) or os.environ.get(ENV_CREDENTIAL)
            if not credential:
                raise UsageError(
                    f"--service needs this node's token: --credential FILE or ${ENV_CREDENTIAL} "
                    "(`gpuaas host token issue NODE --out FILE`)",
                    code=host_codes.CREDENTIAL_MISSING,
                )
            ca = getattr(args, "service_ca", None)
            self.service = agentclient.ServiceSource(
                service_url, self.node, agentclient.load_credential(Path(credential)), verify=str(ca) if ca else True
            )
            return
        if not url:
            raise UsageError(
                f"no control plane: pass --service URL (or set {ENV_SERVICE}) with --credential; "
                "labs may use --plan-file, or --db-url",
                code=host_codes.SERVICE_URL_MISSING,
            )
        from host_reconciler import hostdb

        role = args.db_role or os.environ.get(ENV_ROLE)
        password = os.environ.get(ENV_PASSWORD)
        self.connect = lambda: hostdb.connect(url, role=role, password=password)
        self.conn = self.connect()

    def plan(self) -> hostplans.HostPlan | None:
        if self.service is not None:
            return self.service.plan()
        if self.plan_file is not None:
            from schemas import inputfiles

            try:
                raw = inputfiles.read_bytes(
                    self.plan_file, limit=PLAN_FILE_LIMIT, code=host_codes.PLAN_UNREADABLE, what="plan file"
                )
                doc = json.loads(raw)
            except PermanentError as e:
                raise UsageError(e.message, code=e.code) from e
            except ValueError as e:  # json's message names a position, never the content
                raise UsageError(f"cannot read plan {self.plan_file}: {e}", code=host_codes.PLAN_UNREADABLE) from e
            return hostplans.from_json(doc)
        from host_reconciler import hostdb

        return hostdb.read_plan(self.conn, self.node)

    def report(self, result: converging.PassResult) -> None:
        if result.dry_run:
            return
        if self.service is not None:
            self.service.report("status", result.status.as_dict())
            return
        if self.plan_file is not None:
            if self.status_file is not None:
                self.status_file.write_text(json.dumps(result.status.as_dict(), indent=2, default=str))
            return
        from host_reconciler import hostdb

        hostdb.write_status(self.conn, result.status)

    def answer_rewipes(self, state: Any, plan: hostplans.HostPlan) -> None:
        """Answer this node's `gpuaas slot rewipe` requests before the pass (service or database mode)."""
        from host_reconciler import hostdb, rewiping

        if self.service is not None:
            self.service.answer_rewipes(lambda slot: rewiping.answer(state, plan, slot))
            return
        if self.conn is None:
            return

        for request_id, slot in hostdb.read_rewipes(self.conn, self.node):
            outcome, answer = rewiping.answer(state, plan, slot)
            hostdb.answer_rewipe(self.conn, request_id, outcome, answer)
            logging.getLogger("gpuaas.host").info(
                "rewipe request %d for slot %d: %s",
                request_id,
                slot,
                outcome,
                extra={"event": "host.rewipe", "request": request_id, "slot": slot, "outcome": outcome},
            )

    def heartbeat(self) -> None:
        if self.service is not None:
            self.service.heartbeat()
        elif self.conn is not None:
            from host_reconciler import hostdb

            hostdb.heartbeat(self.conn, self.node)

    def beater(self) -> Callable[[], None] | None:
        """What the heartbeat thread calls every beat (None: nothing to tell, as with --plan-file)."""
        if self.service is not None:
            return self.service.heartbeat
        if self.connect is None:
            return None
        from host_reconciler import hostdb

        connect, node = self.connect, self.node
        held: list[Any] = []

        def beat() -> None:
            try:
                if not held:
                    held.append(connect())
                hostdb.heartbeat(held[0], node)
            except GpuaasError:
                while held:
                    held.pop().close()
                raise

        return beat

    def sleep(self, seconds: float, stop: threading.Event) -> None:
        """Until the next pass: a plan watch on the service (a change ends it early), else a plain wait."""
        if self.service is not None:
            self.service.sleep(seconds, stop)
            return
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            time.sleep(min(0.2, seconds))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.service is not None:
            self.service.close()


class _Heartbeat:
    """Says the agent is alive every `every` seconds from its own thread (and connection or HTTP client).

    A pass may run for minutes (a readiness wait, a wipe); the node must not
    look silent meanwhile. Failures are logged and retried at the next beat.
    """

    def __init__(self, beat: Callable[[], None] | None, every: float) -> None:
        self._beat, self._every = beat, every  # beat None: nothing to tell, no thread
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuaas-heartbeat", daemon=True)

    def start(self) -> None:
        if self._beat is not None:
            self._thread.start()

    def _run(self) -> None:
        log = logging.getLogger("gpuaas.host")
        while not self._stop.wait(self._every):
            try:
                if self._beat is not None:
                    self._beat()
            except GpuaasError as e:
                log.warning("heartbeat failed: %s: %s", e.code, e.message)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def _settings(args: argparse.Namespace) -> settings.HostSettings:
    from host_reconciler import settings
    from host_reconciler.actions import DriftMode

    s = settings.load(args.node, args.config)
    return settings.with_mode(s, DriftMode(args.mode)) if args.mode else s


def _print(result: converging.PassResult, fmt: str) -> None:
    from host_reconciler import reports

    if output.structured(fmt):
        doc = result.status.as_dict()
        doc["actions"] = [a.describe() for a in result.planned]
        doc["executed"] = [{"action": a.describe(), "ms": round(ms, 3)} for a, ms in result.executed]
        output.emit(doc, fmt)
        return
    title = "dry run: would run" if result.dry_run else "ran"
    steps = result.planned if result.dry_run else tuple(a for a, _ in result.executed)
    print(f"{title} {len(steps)} action(s)")
    timings = dict(result.executed) if not result.dry_run else {}
    for a in steps:
        ms = f"  {timings[a]:8.1f} ms" if a in timings else ""
        print(f"  {a.describe()}{ms}")
    print(reports.status_text(result.status.as_dict()))


def _drivers(s: settings.HostSettings) -> Drivers:
    """The real drivers, or host.drivers_missing when the `[host]` extra (libvirt, netlink) is not installed."""
    try:
        from host_reconciler.drivers import wiring
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in {"libvirt", "libvirtmod", "pyroute2"}:
            raise
        raise PermanentError(
            f"the host agent's drivers need libvirt-python and pyroute2 ({e.name} is missing): "
            "pip install 'gpuaas-reconciler[host]'",
            code=host_codes.DRIVERS_MISSING,
        ) from e
    return wiring.drivers(s)


def run_converge(args: argparse.Namespace) -> int:
    from host_reconciler import converging

    s = _settings(args)
    source = _Source(args)
    drivers = _drivers(s)
    try:
        plan = source.plan()
        if plan is None:
            raise PermanentError(f"no host plan for {args.node}", code=host_codes.PLAN_NONE)
        converger = converging.Converger(s, drivers)
        if not args.dry_run:
            source.answer_rewipes(converger.state, plan)
        result = converger.converge(plan, dry_run=args.dry_run)
        source.report(result)
        _print(result, args.output)
        return 0 if result.dry_run or not result.errors else 2
    finally:
        drivers.close()
        source.close()


def run_loop(args: argparse.Namespace) -> int:
    fmt = logs.choose(args.log_format)
    with (
        logs.configured(fmt, text="%(asctime)s %(levelname)s %(name)s: %(message)s", defaults={"node": args.node}),
        _metrics(args) as counted,
    ):
        return _loop(args, counted)


@contextmanager
def _metrics(args: argparse.Namespace) -> Iterator[metrics.AgentMetrics]:
    """The pass counters, served on --metrics-listen (if given) for as long as the loop runs."""
    from host_reconciler import metrics

    counted = metrics.AgentMetrics(args.node)
    if not args.metrics_listen:
        yield counted
        return
    served = metrics.Server(counted, args.metrics_listen, args.metrics_allow_host)
    logging.getLogger("gpuaas.host").info(
        "metrics on %s/metrics, health on %s/healthz",
        served.url,
        served.url,
        extra={"event": "host.metrics.serving", "url": served.url},
    )
    try:
        yield counted
    finally:
        served.close()


def _loop(args: argparse.Namespace, counted: metrics.AgentMetrics) -> int:
    stop = threading.Event()
    with signals.stop_on(stop, signals=(signal.SIGTERM,)):  # SIGINT stays a KeyboardInterrupt (exit 130)
        return _passes(args, counted, stop)


class _Watched:
    """READY=1, then WATCHDOG=1 while the pass loop turns (schemas.notify); STOPPING=1 at the end."""

    def __init__(self, node: str) -> None:
        self.at = time.monotonic()
        self._serving = notify.serving(f"converging {node}", alive=self.turning)

    def started(self) -> _Watched:
        self._serving.__enter__()
        return self

    def tick(self) -> None:
        self.at = time.monotonic()

    def turning(self) -> bool:
        return time.monotonic() - self.at < _STUCK_S

    def stop(self) -> None:
        self._serving.__exit__(None, None, None)


def _passes(args: argparse.Namespace, counted: metrics.AgentMetrics, stop: threading.Event) -> int:
    from host_reconciler import converging

    log = logging.getLogger("gpuaas.host")
    s = _settings(args)
    interval = args.interval if args.interval is not None else s.poll_interval_s
    source = _Source(args)
    drivers = _drivers(s)
    converger = converging.Converger(s, drivers)
    beat = _Heartbeat(source.beater(), HEARTBEAT_S)
    beat.start()
    passes = 0
    watched = _Watched(args.node).started()  # systemd Type=notify: READY=1 now that the drivers are up
    try:
        while not stop.is_set():
            watched.tick()
            wait = interval
            try:
                plan = source.plan()
                if plan is None:
                    log.info("no host plan for %s yet", args.node, extra={"event": "host.plan.none"})
                    source.heartbeat()
                else:
                    source.answer_rewipes(converger.state, plan)
                    result = converger.converge(plan)
                    counted.record(result)
                    source.report(result)
                    if output.structured(args.output):  # one record per pass: a JSON line, a YAML document
                        output.emit(result.status.as_dict(), args.output, indent=None, stream=True)
                    else:
                        _log_pass(log, result)
                    if result.retry_after is not None:
                        wait = min(wait, max(result.retry_after, 0.5))
            except GpuaasError as e:  # the pass failed as a whole (libvirt, database): try again
                counted.failed()
                log.error("pass failed: %s: %s", e.code, e.message, extra={"event": "host.pass.failed", "code": e.code})
                if isinstance(e, PermanentError) and e.code.startswith("host.settings"):
                    raise
            passes += 1
            if args.passes and passes >= args.passes:
                break
            source.sleep(wait, stop)
            watched.tick()
    finally:
        watched.stop()
        beat.stop()
        drivers.close()
        source.close()
    log.info("stopped after %d pass(es)", passes, extra={"event": "host.stopped", "passes": passes})
    return 0


def _log_pass(log: logging.Logger, result: converging.PassResult) -> None:
    """One line per pass, one per step that failed (with its allocation: what an operator searches by)."""
    log.info(
        "pass: %d action(s), %d error(s), converged=%s, %.0f ms",
        len(result.executed),
        len(result.errors),
        result.status.converged,
        result.ms,
        extra={
            "event": "host.pass",
            "generation": result.status.generation,
            "actions": len(result.executed),
            "errors": len(result.errors),
            "converged": result.status.converged,
            "ms": round(result.ms, 1),
        },
    )
    for err in result.errors:
        log.log(
            logging.WARNING if err.retry else logging.ERROR,
            "step %s of %s failed: %s: %s",
            err.step,
            err.allocation_id,
            err.code,
            err.message,
            extra={
                "event": "host.step.failed",
                "allocation": err.allocation_id,
                "step": err.step,
                "code": err.code,
                "retry": err.retry,
                "slots": list(err.slot_indexes),
            },
        )
