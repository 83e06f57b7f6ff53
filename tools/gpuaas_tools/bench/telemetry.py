"""`gpuaas bench telemetry`: guest sample -> API freshness (seed 002 §8), through the real path.

In a scratch database on the chosen server (the embedded one unless
--db-url / GPUAAS_DATABASE_URL; dropped at the end): one synthetic slice node
with --vms one-GPU allocations placed (and marked active, as a converged host
would leave them). Then, in this process:

- the host's guest-marker listener (`guestmarker.Announcements`) on
  127.0.0.1, each VM expected from 127.0.0.1 (no guest boots here, so the
  bench posts what the guest's announcer posts, with the VM's own token);
- the agent's report step every --report-interval seconds (shortened from
  the agent's pass interval): the readiness driver's `guest_telemetry`,
  samples keyed by allocation as `Converger._telemetry` does, written with
  the node's own role by `hostdb.write_status` (allocation_telemetry);
- `gpuaas serve` on 127.0.0.1, polled every --poll-ms by a keep-alive client
  at `GET /api/v1/allocations/{id}/telemetry`.

Each sample carries a unique memory_used_mib; its freshness is the wall time
from just before the guest's POST until the API first returns it. The
listener refuses a VM posting within 5 s of its last sample (429), so the
posts go round the VMs, one every max(0.2, 5.2 / --vms) seconds plus a
random share of the report interval (so a post lands at any phase of the
agent's pass, as a real guest's does). Not
included: the real guest's nvidia-smi run and the agent's full convergence
pass (disks, domains) around the report step.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import os
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpuaas_tools.bench import claims as bench_claims
from reconciler.commands import db
from schemas.errors import UsageError

NODE = "node-00000"
QUERY = "0, GPU-2f6c1d3e-8a4b-4c55-9d1e-0b7a6f3e2c11, 87, {mem}, 143771, 61, 0, [N/A]\n"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "telemetry", help="guest telemetry sample -> API freshness p50/p95 (listener, agent report, store, API)"
    )
    p.add_argument("--samples", type=int, default=40, help="guest samples posted and timed")
    p.add_argument("--vms", type=int, default=8, help="VMs (one-GPU allocations) of the node, 1-8")
    p.add_argument(
        "--report-interval",
        type=float,
        default=1.0,
        help="seconds between the agent's reports (the bench's shortened pass interval)",
    )
    p.add_argument("--poll-ms", type=float, default=10.0, help="how often the API client asks")
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _prepare(url: str, vms: int) -> list[str]:
    from gpuaas_tools.bench import synthetic
    from reconciler.store import claims, connections, inventory, live, migrations

    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        state = synthetic.fleet(nodes=1, allocations=vms, gpus=(1,))
        inventory.sync(conn, state)
        placements = synthetic.first_fit(state, live.free_slots(conn), sorted(state.allocations))
        placed = [r.allocation_id for r in claims.place_many(conn, placements, revision="bench") if r.placed]
        # What a converged host leaves behind: the API serves telemetry of active allocations.
        conn.execute("UPDATE allocations SET status = 'active' WHERE id = ANY(%s)", (placed,))
    if len(placed) != vms:
        raise UsageError(f"placed {len(placed)} of {vms} allocations", code="bench.telemetry.setup_failed")
    return placed


class _Agent(threading.Thread):
    """The host agent's report step, every `interval` seconds, until stopped."""

    def __init__(self, url: str, gate: Any, expected: dict[str, str], by_name: dict[str, str], interval: float) -> None:
        super().__init__(daemon=True)
        self._url, self._gate, self._expected, self._by_name = url, gate, expected, by_name
        self._interval = interval
        self.stop = threading.Event()
        self.expecting = threading.Event()  # set once the listener knows the VMs' addresses
        self.reports = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        from host_reconciler import hostdb
        from host_reconciler.actions import DriftMode
        from reconciler.store import connections

        try:
            with connections.connect(self._url, autocommit=True) as conn:
                creds = hostdb.create_node_role(conn, NODE, "bench-telemetry")
            with hostdb.connect(self._url, role=creds.role, password=creds.password) as conn:
                generation = 0
                while not self.stop.is_set():
                    generation += 1
                    latest = self._gate.guest_telemetry(self._expected)
                    self.expecting.set()
                    samples = {self._by_name[n]: s for n, s in latest.items() if n in self._by_name}
                    hostdb.write_status(conn, _status(generation, samples, DriftMode.REPORT))
                    self.reports += 1
                    self.stop.wait(self._interval)
        except BaseException as e:  # surfaced by the main thread
            self.error = e
            self.expecting.set()


def _status(generation: int, samples: dict[str, Any], mode: Any) -> Any:
    from host_reconciler.statuses import HostStatus

    return HostStatus(NODE, generation, generation, mode, True, True, (), (), (), (), (), telemetry=samples)


def _post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url, data=body, method="POST")  # noqa: S310 -- http://127.0.0.1 only
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


def _seen(client: http.client.HTTPConnection, alloc: str, mem: int) -> bool:
    client.request("GET", f"/api/v1/allocations/{alloc}/telemetry")
    resp = client.getresponse()
    doc = json.loads(resp.read())
    gpus = doc.get("gpus") or []
    return resp.status == 200 and bool(gpus) and gpus[0].get("memory_used_mib") == mem


def _post_and_wait(post_url: str, body: bytes, seen: Any, agent: _Agent, *, args: argparse.Namespace, i: int) -> None:
    """Post one guest sample and poll the API until it shows it."""
    started = time.perf_counter()
    status = _post(post_url, body)
    if status != 204:
        raise UsageError(f"the listener answered {status} to sample {i}", code="bench.telemetry.post_refused")
    deadline = started + 30 + 3 * args.report_interval
    while not seen():
        if agent.error is not None:
            raise agent.error
        if time.perf_counter() > deadline:
            raise UsageError(f"sample {i} never reached the API", code="bench.telemetry.lost")
        time.sleep(args.poll_ms / 1000)


def _measure(url: str, placed: list[str], args: argparse.Namespace) -> tuple[list[float], int]:
    from host_reconciler.drivers import guestmarker, readiness
    from reconciler.service import server
    from schemas.hostplans import vm_name

    heard = guestmarker.Announcements(os.urandom(32), port=0)
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-telemetry-") as tmp:
        gate = readiness.LeaseReadiness(Path(tmp) / "dnsmasq.leases", announcements=heard)
        by_name = {vm_name(a): a for a in placed}
        heard.listen("127.0.0.1")
        agent = _Agent(url, gate, {n: "127.0.0.1" for n in by_name}, by_name, args.report_interval)
        httpd = server.make_server(url, server.Settings(port=0, capacity_wait_s=3600.0, capacity_refresh_s=3600.0))
        serving = threading.Thread(target=httpd.serve_forever, daemon=True)
        serving.start()
        agent.start()
        took: list[float] = []
        try:
            host, port = httpd.socket.getsockname()[:2]
            client = http.client.HTTPConnection(host, port, timeout=60)
            post_url = f"http://127.0.0.1:{heard.port}{guestmarker.TELEMETRY_PATH}"
            names = sorted(by_name)
            rng = random.Random(0)  # noqa: S311 - post phase jitter, not security
            spacing = max(0.2, (5.0 + 0.2) / len(names))  # each VM posts at most once per 5 s (else 429)
            # A sample before the agent's first pass told the listener the VMs' addresses is refused (403):
            # wait for that pass, not for a fixed time (its database login can take seconds on a busy machine).
            if not agent.expecting.wait(timeout=120):
                raise UsageError("the agent's first pass took over 120 s", code="bench.telemetry.agent_stuck")
            if agent.error is not None:
                raise agent.error
            for i in range(args.samples):
                name = names[i % len(names)]
                mem = 1000 + i
                body = (
                    f"gpuaas-telemetry 1\nname {name}\ntoken {heard.token(name)}\ngpu {QUERY.format(mem=mem)}"
                ).encode()
                started = time.perf_counter()
                _post_and_wait(
                    post_url, body, functools.partial(_seen, client, by_name[name], mem), agent, args=args, i=i
                )
                took.append(time.perf_counter() - started)
                # A random phase against the agent's pass: a post right after a seen sample would always
                # land just after a report and wait a whole interval (the worst case, not the typical one).
                time.sleep(max(0.0, spacing - (time.perf_counter() - started)) + rng.uniform(0, args.report_interval))
                if (i + 1) % 10 == 0 and not args.json:
                    print(f"  {i + 1}/{args.samples} samples", flush=True)
            client.close()
        finally:
            agent.stop.set()
            agent.join(timeout=30)
            httpd.shutdown()
            httpd.server_close()
            httpd.service.close()
            gate.close()
    return took, agent.reports


def run(args: argparse.Namespace) -> int:
    if args.samples < 1 or not 1 <= args.vms <= 8 or args.report_interval <= 0 or args.poll_ms <= 0:
        raise UsageError(
            "--samples must be positive, --vms 1-8, --report-interval and --poll-ms above 0",
            code="bench.telemetry.usage",
        )
    base = db.database_url(args)
    name = f"gpuaas_bench_telemetry_{os.getpid()}"
    bench_claims._create_db(base, name)
    url = bench_claims._scratch_url(base, name)
    try:
        placed = _prepare(url, args.vms)
        took, reports = _measure(url, placed, args)
    finally:
        bench_claims._drop_db(base, name)
    ordered = sorted(took)
    doc = {
        "samples": len(ordered),
        "vms": args.vms,
        "report_interval_s": args.report_interval,
        "poll_ms": args.poll_ms,
        "agent_reports": reports,
        "p50_ms": round(statistics.median(ordered) * 1000, 1),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
        "path": "guest POST -> listener -> agent report (write_status, node role) -> allocation_telemetry"
        " -> GET /api/v1/allocations/{id}/telemetry",
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"telemetry bench: {doc['samples']} samples over {args.vms} VMs, agent report every "
            f"{args.report_interval:g} s, API polled every {args.poll_ms:g} ms"
        )
        print(f"  guest sample -> API  p50 {doc['p50_ms']} ms  p95 {doc['p95_ms']} ms  max {doc['max_ms']} ms")
    return 0
