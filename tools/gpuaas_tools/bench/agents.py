"""`gpuaas bench agents --agents N [--duration S] [--restart] [--json]`: N host agents against one `gpuaas serve`.

The bench makes a scratch database on the embedded (or given) PostgreSQL
with N nodes, a plan and a token each, starts `gpuaas serve` as its own
process, and runs N simulated agents in this process (asyncio, one HTTP/1.1
keep-alive connection each, the real agent API): each watches its plan
(long-poll, at most 15 s; the service counts each watch as the agent's
heartbeat, so an agent sends a heartbeat request only when it has not
watched for 15 s; `--explicit-heartbeats` adds one every 15 s anyway), and
sends a status report when its plan changes. Agents start spread over
`--ramp` seconds. Meanwhile the bench commits a new plan generation for a
random node every `--place-every` seconds and measures commit -> plan
received by that node's agent.

`--restart` stops serve (SIGTERM) a third into the run and starts it again:
the agents reconnect with exponential backoff and jitter; the bench reports
how long serve was away, how long after it listened again half and all of the
agents had a successful request, and how many nodes `node_liveness` showed
unavailable at the end.

Figures: agents, errors (failed requests, not counting refused connections
while serve restarts), plan latency p50/p99, the most PostgreSQL
connections seen in pg_stat_activity for the database, serve's RSS, serve's
CPU seconds per 1000 requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuaas_tools.bench import claims as bench_claims
from reconciler.commands import db
from schemas import agentwire, output
from schemas.errors import UsageError

WATCH_S = 15.0


def register(sub: Any) -> None:
    p = sub.add_parser("agents", help="N simulated host agents (real HTTP) against one serve: plan latency, cost")
    p.add_argument("--agents", type=int, default=1000, help="simulated agents (default 1000)")
    p.add_argument("--duration", type=float, default=60.0, metavar="S", help="measured seconds (default 60)")
    p.add_argument(
        "--ramp", type=float, default=0.0, metavar="S", help="spread agent starts over S seconds (default: agents/500)"
    )
    p.add_argument("--place-every", type=float, default=0.2, metavar="S", help="seconds between placements")
    p.add_argument("--restart", action="store_true", help="restart serve mid-run; report the reconnection")
    p.add_argument(
        "--explicit-heartbeats",
        action="store_true",
        help="a heartbeat request every 15 s besides the watches (default: the watch is the heartbeat)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    output.add_argument(p, "text")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


@dataclass
class Figures:
    requests: int = 0
    errors: int = 0
    refused: int = 0  # connections refused or cut while serve restarts (retried)
    latencies: list[float] = field(default_factory=list)
    error_statuses: dict[int, int] = field(default_factory=dict)
    last_ok: dict[int, float] = field(default_factory=dict)
    restart_up: float | None = None  # when the restarted serve was listening again (monotonic)
    back_at: dict[int, float] = field(default_factory=dict)  # agent -> its first success on the restarted serve


class Conn:
    """One agent's HTTP/1.1 keep-alive connection (a minimal client: the bench's own cost must stay small)."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.auth = port, f"Authorization: Bearer {token}\r\n"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{self.auth}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        try:
            self.writer.write(head + body)
            raw = await self.reader.readuntil(b"\r\n\r\n")
            status = int(raw[9:12])
            length = 0
            close = False
            for line in raw.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            data = await self.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            self.close()
            raise
        if close:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Shared:
    port: int
    fig: Figures
    commits: dict[str, float]  # "node:generation" -> when the bench committed it (monotonic)
    stop: asyncio.Event
    explicit_beats: bool = False  # a heartbeat POST every 15 s even while watches carry the heartbeat


async def _agent(i: int, node: str, token: str, start: float, shared: Shared) -> None:
    await asyncio.sleep(start)
    fig, stop = shared.fig, shared.stop
    conn = Conn(shared.port, token)
    rng = random.Random(i)  # noqa: S311 - jitter, not security
    gen: int | None = None
    failures = 0
    next_beat = time.monotonic() + rng.uniform(0, WATCH_S)
    try:
        while not stop.is_set():
            try:
                path = agentwire.plan_path(node) + ("" if gen is None else f"?after={gen}&wait={WATCH_S:g}")
                status, body = await conn.request("GET", path)
                if gen is not None and not shared.explicit_beats:
                    next_beat = time.monotonic() + WATCH_S  # the service counted that watch as a heartbeat
                fig.requests += 1
                if status != 200:
                    raise _Failed(status)
                doc = json.loads(body)
                fig.last_ok[i] = now = time.monotonic()
                if fig.restart_up is not None and i not in fig.back_at:
                    fig.back_at[i] = now
                failures = 0
                if doc["changed"]:
                    gen = await _changed(conn, node, gen, int(doc["generation"] or 0), shared)
                if time.monotonic() >= next_beat:
                    status, _ = await conn.request("POST", agentwire.heartbeat_path(node))
                    fig.requests += 1
                    if status != 200:
                        raise _Failed(status)
                    next_beat = time.monotonic() + WATCH_S
            except _Failed as e:
                fig.errors += 1
                fig.error_statuses[e.status] = fig.error_statuses.get(e.status, 0) + 1
                failures += 1
                conn.close()
                await asyncio.sleep(rng.random() * min(30.0, 0.5 * 2 ** min(failures, 10)))
            except (OSError, asyncio.IncompleteReadError, ValueError):
                fig.refused += 1
                failures += 1
                await asyncio.sleep(rng.random() * min(30.0, 0.5 * 2 ** min(failures, 10)))
    finally:
        conn.close()  # also when cancelled at the end of the run


async def _changed(conn: Conn, node: str, held: int | None, new: int, shared: Shared) -> int:
    """A new plan arrived: its latency from the commit, and (after the first plan) a status report."""
    committed = shared.commits.pop(f"{node}:{new}", None)
    if committed is not None:
        shared.fig.latencies.append(time.monotonic() - committed)
    if held is not None:
        report = {
            "node": node,
            "generation": new,
            "observed_generation": new,
            "healthy": True,
            "slots": [],
            "vms": [],
            "drift": [],
            "errors": [],
            "images": {"cached": []},
        }
        status, _ = await conn.request("POST", agentwire.report_path(node, "status"), json.dumps(report).encode())
        shared.fig.requests += 1
        if status != 200:
            raise _Failed(status)
    return new


class _Failed(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _seed(url: str, n: int) -> list[tuple[str, str]]:
    from psycopg.types.json import Jsonb

    from reconciler.service import agenttokens
    from reconciler.store import connections, migrations

    names = [f"bench-{i:06d}" for i in range(n)]
    tokens = [agenttokens.new_token() for _ in names]
    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        conn.execute(
            """INSERT INTO nodes (name, region, pool, admin_state, storage_mode, os_disk, capability,
                                  management_network)
               SELECT n, 'us-east-1', 'h200-slice', 'active', 'slice', '/dev/disk/by-id/nvme-OS', 'both_capable',
                      %s FROM unnest(%s::text[]) n""",
            (Jsonb({"bridge": "gpuaasbr0"}), names),
        )
        conn.execute(
            "INSERT INTO host_plans (node_name, generation, spec) SELECT n, 1, jsonb_build_object('node', n,"
            " 'generation', 1, 'vms', '[]'::jsonb) FROM unnest(%s::text[]) n",
            (names,),
        )
        conn.execute(
            "INSERT INTO host_status (node_name, observed_generation) SELECT n, 1 FROM unnest(%s::text[]) n", (names,)
        )
        conn.execute(
            "INSERT INTO node_agent_tokens (node_name, token_sha256) SELECT * FROM unnest(%s::text[], %s::text[])",
            (names, [agenttokens.token_hash(t) for t in tokens]),
        )
    return list(zip(names, tokens, strict=True))


class Serve:
    def __init__(self, url: str) -> None:
        self.url = url
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self, port: int = 0) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUAAS_DATABASE_URL": self.url}  # a URL is never an argv
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{int(port)}",
                "--max-connections",
                "15000",
                "--capacity-refresh",
                "3600",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline() if self.proc.stdout is not None else ""
        if not line.startswith("serving on "):
            raise UsageError(f"serve did not start: {line.strip()}", code="bench.serve_failed")
        self.port = int(line.split()[2].rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def rss_mib(self) -> float:
        if self.proc is None:
            return 0.0
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        if self.proc is None:
            return 0.0
        with open(f"/proc/{self.proc.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 4)


async def _drive(args: argparse.Namespace, url: str, serve: Serve, agents: list[tuple[str, str]]) -> dict[str, Any]:
    from reconciler.store import connections

    fig = Figures()
    commits: dict[str, float] = {}
    stop = asyncio.Event()
    ramp = args.ramp or len(agents) / 500
    shared = Shared(serve.port, fig, commits, stop, args.explicit_heartbeats)
    lag: list[float] = []
    ticker = asyncio.create_task(_loop_lag(lag, stop))
    tasks = [
        asyncio.create_task(_agent(i, node, token, ramp * i / len(agents), shared))
        for i, (node, token) in enumerate(agents)
    ]
    rng = random.Random(1)  # noqa: S311 - which node gets a placement
    conn = connections.connect(url, autocommit=True)
    dbname = conn.info.dbname
    db_max = rss_max = 0.0
    restart: dict[str, Any] = {}
    try:
        await asyncio.sleep(ramp + 2.0)
        t0, cpu0, req0 = time.monotonic(), serve.cpu_s(), fig.requests
        next_sample = 0.0
        restarted = False
        while time.monotonic() - t0 < args.duration:
            node = agents[rng.randrange(len(agents))][0]
            row = conn.execute(
                "UPDATE host_plans SET generation = generation + 1, spec = jsonb_set(spec,"
                " '{generation}', to_jsonb(generation + 1)) WHERE node_name = %s"
                " RETURNING generation",
                (node,),
            ).fetchone()
            if row is not None:
                commits[f"{node}:{row[0]}"] = time.monotonic()
            if time.monotonic() >= next_sample:
                n = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)).fetchone()
                db_max = max(db_max, float(n[0]) - 1 if n else 0.0)  # less the bench's own connection
                rss_max = max(rss_max, serve.rss_mib())
                next_sample = time.monotonic() + 1.0
            if args.restart and not restarted and time.monotonic() - t0 > args.duration / 3:
                restarted = True
                cpu_before = serve.cpu_s()
                port = serve.port
                down = time.monotonic()
                await asyncio.to_thread(serve.stop)  # in a thread: the agents live through the outage
                await asyncio.to_thread(serve.start, port)
                fig.restart_up = time.monotonic()
                cpu0 -= cpu_before  # the new process starts from 0 CPU seconds
                restart["down_s"] = round(fig.restart_up - down, 2)
            await asyncio.sleep(args.place_every)
        cpu = serve.cpu_s() - cpu0
        requests = fig.requests - req0
        if restart:
            _reconnection(restart, fig, len(agents), conn)
    finally:
        stop.set()
        conn.close()
        for t in (*tasks, ticker):
            t.cancel()
        await asyncio.gather(*tasks, ticker, return_exceptions=True)
    return {
        "agents": len(agents),
        "errors": fig.errors,
        "error_statuses": fig.error_statuses,
        "connection_retries": fig.refused,
        "plan_latency_p50_s": _pct(fig.latencies, 0.5),
        "plan_latency_p99_s": _pct(fig.latencies, 0.99),
        "placements_received": len(fig.latencies),
        "db_connections_max": int(db_max),
        "serve_rss_mib": round(rss_max, 1),
        "serve_cpu_s_per_1000_requests": round(cpu / max(1, requests) * 1000, 3),
        "requests": requests,
        "duration_s": args.duration,
        "bench_loop_lag_p99_s": _pct(lag, 0.99),
        **({"restart": restart} if restart else {}),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


async def _loop_lag(lag: list[float], stop: asyncio.Event) -> None:
    """How late this process's event loop runs (the agents' own delay, not the service's)."""
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(0.1)
        lag.append(time.monotonic() - t - 0.1)


def _reconnection(restart: dict[str, Any], fig: Figures, n: int, conn: Any) -> None:
    """How long after the restart every agent had a successful request again; nodes liveness marks unavailable."""
    up = fig.restart_up or 0.0
    back = sorted(t - up for t in fig.back_at.values())
    missing = n - len(back)
    restart["agents_not_reconnected"] = missing
    restart["reconnected_p50_s"] = _pct(back, 0.5)
    restart["all_reconnected_within_s"] = None if missing else round(back[-1], 2)
    row = conn.execute("SELECT count(*) FROM node_liveness WHERE liveness = 'unavailable'").fetchone()
    restart["nodes_unavailable"] = int(row[0]) if row else None


def run(args: argparse.Namespace) -> int:
    if args.agents < 1 or args.duration <= 0:
        raise UsageError("--agents and --duration must be positive", code="bench.usage")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.agents + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))  # serve inherits it too
    if min(want, hard) < want:
        raise UsageError(
            f"--agents {args.agents} needs {want} open files; the hard limit is {hard}", code="bench.nofile"
        )
    base = db.database_url(args)
    name = f"gpuaas_bench_agents_{os.getpid()}"
    bench_claims._create_db(base, name)
    url = bench_claims._scratch_url(base, name)
    serve = Serve(url)
    try:
        agents = _seed(url, args.agents)
        serve.start()
        try:
            factory: Callable[[], asyncio.AbstractEventLoop] | None = None
            with contextlib.suppress(ImportError):
                import uvloop

                factory = uvloop.new_event_loop  # this run's loop only: no process-wide policy left behind
            with asyncio.Runner(loop_factory=factory) as runner:
                doc = runner.run(_drive(args, url, serve, agents))
        finally:
            serve.stop()
    finally:
        bench_claims._drop_db(base, name)
    if args.json or output.structured(args.output):
        print(json.dumps(doc))
    else:
        for k, v in doc.items():
            print(f"{k}: {v}")
    return 0
