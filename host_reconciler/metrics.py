"""The host agent's own /metrics and /healthz (`gpuaas host run --metrics-listen HOST:PORT`).

Fed from each pass's `PassResult`, in this process: the agent is the only
one who saw the pass (the central `serve` reads the store, which holds the
status but not timings of failed steps). Counters and histograms are
cumulative since start; the drift, slot and convergence gauges describe the
newest finished pass.

    gpuaas_host_passes_total{result}            ok | step_errors | failed (the pass as a whole)
    gpuaas_host_converge_seconds                histogram of pass durations
    gpuaas_host_actions_total{kind,result}      kind: the step (wipe, define_start, ...); ok | retry | failed
    gpuaas_host_wipe_seconds                    histogram of successful wipe steps
    gpuaas_host_wipes_total{result}             ok | retry | blocked
    gpuaas_host_drift_findings{code}            after the newest pass
    gpuaas_host_slots{state}                    after the newest pass
    gpuaas_host_converged                       1 when the newest pass left nothing pending
    gpuaas_host_last_pass_timestamp_seconds     unix time the newest pass finished
    gpuaas_build_info{version,python}           1
    process_*                                   CPU, memory, file descriptors of the agent

No `_created` series: a counter's creation time is noise to an alert and
doubles the series (prometheus_client's switch, process-wide; the agent's
process exports nothing else).

/healthz answers 200 while the process serves (alive), with the node and
the newest pass's age; it needs no database.

The listener answers only for names it serves: a request whose `Host` is
not a loopback name, the listen address, or one given with
`--metrics-allow-host` gets 421 (a web page cannot read it by rebinding its
own DNS name to this address). At most MAX_CONNECTIONS at once, each cut
after DEADLINE_S (`host_reconciler.listening`).
"""

from __future__ import annotations

import collections
import json
import platform
import socket
import threading
import time
from collections.abc import Collection, Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from host_reconciler import codes as host_codes
from host_reconciler import listening
from schemas.errors import UsageError

MAX_CONNECTIONS = 16  # a scraper or two and a health probe
DEADLINE_S = 10.0  # a whole request, however slowly it is sent

if TYPE_CHECKING:
    from host_reconciler.converging import PassResult

CONVERGE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
WIPE_BUCKETS = (1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400, 43200)
_WIPE = "wipe"


prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client


class AgentMetrics:
    """What the agent counts; `record` after each pass, `failed` when a pass failed as a whole."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        self.passes = Counter("gpuaas_host_passes", "host passes by result", ["result"], registry=self.registry)
        self.converge = Histogram(
            "gpuaas_host_converge_seconds",
            "duration of a converge pass",
            buckets=CONVERGE_BUCKETS,
            registry=self.registry,
        )
        self.actions = Counter(
            "gpuaas_host_actions", "host actions by kind (step) and result", ["kind", "result"], registry=self.registry
        )
        self.wipe = Histogram(
            "gpuaas_host_wipe_seconds",
            "duration of a successful wipe step",
            buckets=WIPE_BUCKETS,
            registry=self.registry,
        )
        self.wipes = Counter("gpuaas_host_wipes", "wipe steps by result", ["result"], registry=self.registry)
        self._latest = _Latest(node)
        self.registry.register(self._latest)
        ProcessCollector(registry=self.registry)
        from host_reconciler import hostmetrics  # onboarding gauges: reboot, firmware, bootstrap, version

        self._host = hostmetrics.HostReportGauges()
        self.registry.register(self._host)

    def record(self, result: PassResult) -> None:
        if result.dry_run:
            return
        self.passes.labels("step_errors" if result.errors else "ok").inc()
        self.converge.observe(result.ms / 1000)
        for action, ms in result.executed:
            self.actions.labels(str(action.step), "ok").inc()
            if action.step == _WIPE:
                self.wipe.observe(ms / 1000)
                self.wipes.labels("ok").inc()
        for err in result.errors:
            self.actions.labels(err.step, "retry" if err.retry else "failed").inc()
            if err.step == _WIPE:
                self.wipes.labels("retry" if err.retry else "blocked").inc()
        status = result.status
        self._host.report = status.host
        self._host.refused = dict(status.guest_refused)
        self._latest.last = (
            collections.Counter(str(d.code) for d in status.drift),
            collections.Counter(str(s.state) for s in status.slots),
            status.converged,
            time.time(),
        )

    def failed(self) -> None:
        self.passes.labels("failed").inc()

    def health(self) -> dict[str, Any]:
        finished = self._latest.last[3] if self._latest.last else None
        return {
            "status": "ok",
            "node": self.node,
            "last_pass_age_s": round(time.time() - finished, 3) if finished is not None else None,
        }


class _Latest(Collector):
    """Gauges of the newest pass, swapped as one tuple (a scrape never sees half a pass)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.last: tuple[collections.Counter[str], collections.Counter[str], bool, float] | None = None

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("gpuaas_host_info", "the node this agent converges", labels=["node"])
        info.add_metric([self.node], 1)
        yield info
        build = GaugeMetricFamily(
            "gpuaas_build_info", "the running gpuaas: its version and Python (always 1)", labels=["version", "python"]
        )
        build.add_metric([_version(), platform.python_version()], 1)
        yield build
        last = self.last
        if last is None:
            return
        drift, slots, converged, finished = last
        yield _by("gpuaas_host_drift_findings", "drift findings of the newest pass by code", "code", drift)
        yield _by("gpuaas_host_slots", "slots by state after the newest pass", "state", slots)
        yield GaugeMetricFamily(
            "gpuaas_host_converged", "1 when the newest pass left nothing pending", value=1 if converged else 0
        )
        yield GaugeMetricFamily(
            "gpuaas_host_last_pass_timestamp_seconds", "when the newest pass finished", value=finished
        )


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gpuaas-reconciler")
    except metadata.PackageNotFoundError:
        return "unknown"


def _by(name: str, doc: str, label: str, counts: collections.Counter[str]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=[label])
    for key in sorted(counts):
        g.add_metric([key], counts[key])
    return g


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:9101` for IPv6; port 0 picks a free one)."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UsageError(
            f"--metrics-listen {value!r}: expected HOST:PORT, for example 127.0.0.1:9101",
            code=host_codes.METRICS_LISTEN_INVALID,
        )
    return host, int(port)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def _serve(self) -> None:
        path = self.path.split("?", 1)[0]
        if not listening.host_allowed(self.headers.get("Host"), self.server.allowed_hosts):
            status, ctype = 421, "application/json"
            body = json.dumps(
                {
                    "error": {
                        "code": host_codes.METRICS_HOST_NOT_ALLOWED,
                        "message": "this listener does not serve that Host name (--metrics-allow-host)",
                    }
                }
            ).encode()
        elif path == "/metrics":
            status, ctype, body = 200, CONTENT_TYPE_LATEST, generate_latest(self.server.metrics.registry)
        elif path == "/healthz":
            status, ctype, body = 200, "application/json", json.dumps(self.server.metrics.health()).encode()
        else:
            status, ctype = 404, "application/json"
            body = json.dumps({"error": {"code": host_codes.METRICS_NOT_FOUND, "message": f"no {path}"}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every 15 s is not worth a log line (and stderr carries the agent's JSON log)


class _HTTPServer(listening.BoundedServer):
    def __init__(self, address: tuple[str, int], metrics: AgentMetrics, allowed_hosts: frozenset[str]) -> None:
        self.metrics, self.allowed_hosts = metrics, allowed_hosts
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler, max_connections=MAX_CONNECTIONS, deadline_s=DEADLINE_S)


class Server:
    """/metrics and /healthz on their own thread; `close` stops it.

    `allow_hosts`: the Host names answered besides the loopback names and
    the listen address (`*`: any, for a listener behind a proxy that checks).
    """

    def __init__(self, metrics: AgentMetrics, listen: str, allow_hosts: Collection[str] = ()) -> None:
        host, port = parse_listen(listen)
        allowed = frozenset({*listening.LOOPBACK_NAMES, host.lower(), *(h.lower().rstrip(".") for h in allow_hosts)})
        try:
            self._httpd = _HTTPServer((host, port), metrics, allowed)
        except OSError as e:
            raise UsageError(
                f"--metrics-listen {listen}: cannot bind: {e.strerror or e}", code=host_codes.METRICS_BIND_FAILED
            ) from e
        bound = self._httpd.server_address
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{bound[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.5}, name="gpuaas-host-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)
