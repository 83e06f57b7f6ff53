"""`gpuaas bench serve --nodes 10000`: latency of the read API and the dashboard on a big fleet.

In a scratch database on the chosen server (the embedded one unless
--db-url / GPUAAS_DATABASE_URL; dropped at the end): a synthetic fleet of N
slice nodes (8 slots each) is synced, M allocations are placed first-fit
(one transaction each, as `bench claims` does) and one reconciliation is
recorded. Then `gpuaas serve` runs in this process on 127.0.0.1 and one
keep-alive client times, each over --samples requests (wall time per
request, client side): `GET /api/v1/allocations/{id}` (random placed ids),
`GET /api/v1/capacity` (the first one computes the capacity model: reported
on its own as the cold time; the rest are served from the snapshot cache),
the dashboard `GET /` (first page of the grid) and `GET /metrics`.

Then the service is restarted twice, each time as a fresh `gpuaas serve`
process with its default settings (as a supervisor restarts it), and the
time from starting that process to its first 200 of `GET /api/v1/capacity`
(retrying each 503 after 0.1 s, as a client honouring Retry-After would
sooner) is reported, with the time to its "serving on" line:
once with nothing committed since the last document was computed, once
after a commit (the document is then served stale until the fresh one is
computed). Each is the cold time again where no document is kept.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from typing import IO, Any

from gpuaas_tools.bench import claims as bench_claims
from reconciler.commands import db
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="read API p50 (allocations/{id}, capacity) and dashboard render time")
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=20_000, help="allocations placed before measuring")
    p.add_argument("--samples", type=int, default=200, help="requests timed per endpoint")
    p.add_argument("--keep", action="store_true", help="keep the scratch database")
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


def _timed(client: http.client.HTTPConnection, path: str) -> float:
    t0 = time.perf_counter()
    client.request("GET", path)
    resp = client.getresponse()
    body = resp.read()
    took = time.perf_counter() - t0
    if resp.status != 200:
        raise UsageError(f"GET {path}: {resp.status} {body[:300]!r}", code="bench.serve.request_failed")
    return took


def _restart(url: str, *, commit_first: bool, timeout_s: float = 300.0) -> dict[str, Any]:
    """Seconds from starting `gpuaas serve` (a fresh process, default settings) to its first 200 for the capacity.

    A fresh process, as a supervisor restarts the service: interpreter, imports, bind, the kept document
    loaded. Run inside this one, the restart inherited the bench's own heap (the synthetic fleet, the
    previous service's garbage), and a full collection over it (2.3 s at 10,000 nodes) landed in some
    restarts and not others. `ready_line_s`: to the "serving on" line.
    """
    from reconciler.store import connections

    if commit_first:  # any commit (a claim, a host report) since the last document was computed
        with connections.connect(url, autocommit=True) as conn:
            conn.execute("SELECT txid_current()")
    # The log goes to a file, not a pipe: a chatty service never blocks on it while it is timed.
    with tempfile.TemporaryFile(mode="w+") as err:
        t0 = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "reconciler.cli", "serve", "--listen", "127.0.0.1:0", f"--db-url={url}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        try:
            line = _first_line(child, err, timeout_s)
            ready = time.perf_counter() - t0
            return {**_first_capacity(line, t0, timeout_s), "ready_line_s": round(ready, 2)}
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)  # the service's own stop, as a supervisor's
            try:
                child.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()


def _first_capacity(line: str, t0: float, timeout_s: float) -> dict[str, Any]:
    """Seconds since `t0` to the first 200 for the capacity from the service `line` names, and whether stale."""
    where = urllib.parse.urlsplit(line.split()[2])
    client = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=timeout_s)
    try:
        while True:
            client.request("GET", "/api/v1/capacity")
            resp = client.getresponse()
            body = resp.read()
            if resp.status == 200:
                return {"s": round(time.perf_counter() - t0, 2), "stale": bool(json.loads(body).get("stale"))}
            if resp.status != 503 or time.perf_counter() - t0 > timeout_s:
                raise UsageError(
                    f"GET /api/v1/capacity: {resp.status} {body[:300]!r}", code="bench.serve.request_failed"
                )
            time.sleep(0.1)
    finally:
        client.close()


def _first_line(child: subprocess.Popen[str], err: IO[str], timeout_s: float) -> str:
    """The service's "serving on URL ..." line; the end of its log in the error when it exits or stays silent."""
    out = child.stdout
    ready = select.select([out], [], [], timeout_s)[0] if out is not None else []
    line = out.readline() if out is not None and ready else ""
    if not line.startswith("serving on "):
        child.kill()
        child.communicate()
        err.seek(0)
        raise UsageError(
            f"gpuaas serve did not start within {timeout_s:.0f} s: {line.strip()!r} {err.read()[-500:]!r}",
            code="bench.serve.request_failed",
        )
    return line


def _prepare(url: str, args: argparse.Namespace) -> tuple[list[str], dict[str, float]]:
    from gpuaas_tools.bench import synthetic
    from reconciler.store import claims, connections, history, inventory, live, migrations

    fleet = {"nodes": args.nodes, "allocations": args.requests, "gpus": (1, 2, 4)}
    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        t0 = time.perf_counter()
        state = synthetic.fleet(**fleet)
        run_id = history.start(conn, revision="bench", source="bench serve")
        inventory.sync(conn, state)
        sync_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        placements = synthetic.first_fit(state, live.free_slots(conn), sorted(state.allocations))
        placed = [r.allocation_id for r in claims.place_many(conn, placements, revision="bench") if r.placed]
        place_s = time.perf_counter() - t0
        history.finish(conn, run_id, result="changed", counts={"placed": len(placed)})
    return placed, {"sync_s": round(sync_s, 2), "place_s": round(place_s, 2)}


def run(args: argparse.Namespace) -> int:
    from reconciler.service import server

    if args.nodes < 1 or args.requests < 1 or args.samples < 1:
        raise UsageError("--nodes, --requests and --samples must be positive")
    base = db.database_url(args)
    name = f"gpuaas_bench_serve_{os.getpid()}"
    bench_claims._create_db(base, name)
    url = bench_claims._scratch_url(base, name)
    try:
        placed, setup = _prepare(url, args)
        # As `gpuaas serve` starts (reconciler/commands/serve.py): the fleet this bench built is not the
        # service's, and collections walking it would be timed as the service's.
        gc.collect()
        gc.freeze()
        httpd = server.make_server(url, server.Settings(port=0, capacity_wait_s=3600.0, capacity_refresh_s=3600.0))
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            host, port = httpd.socket.getsockname()[:2]
            client = http.client.HTTPConnection(host, port, timeout=3600)
            rng = random.Random(0)  # noqa: S311 - which ids to ask for, not security
            cold = _timed(client, "/api/v1/capacity")
            results = {
                "allocation": _stats(
                    [_timed(client, f"/api/v1/allocations/{rng.choice(placed)}") for _ in range(args.samples)]
                ),
                "capacity_warm": _stats([_timed(client, "/api/v1/capacity") for _ in range(args.samples)]),
                "dashboard": _stats([_timed(client, "/") for _ in range(max(5, args.samples // 10))]),
                "node_page": _stats(
                    [
                        _timed(client, f"/nodes/node-{rng.randrange(args.nodes):05d}")
                        for _ in range(max(5, args.samples // 10))
                    ]
                ),
                # the fleet page with a search: nodes, allocations and tenants matching (issue 34)
                "dashboard_search": _stats(
                    [
                        _timed(client, f"/?q=node-{rng.randrange(args.nodes):05d}")
                        for _ in range(max(5, args.samples // 10))
                    ]
                ),
                "dashboard_tenant": _stats(
                    [_timed(client, f"/?tenant=tenant-{rng.randrange(97)}") for _ in range(max(5, args.samples // 10))]
                ),
                "allocation_page": _stats(
                    [_timed(client, f"/allocations/{rng.choice(placed)}") for _ in range(max(5, args.samples // 10))]
                ),
                "metrics": _stats([_timed(client, "/metrics") for _ in range(max(5, args.samples // 10))]),
            }
            client.close()
        finally:
            httpd.service.capacity.join()  # a computed document is kept before the restart
            httpd.shutdown()
            httpd.server_close()
            httpd.service.close()
        restart = {
            "capacity_restart": _restart(url, commit_first=False),
            "capacity_restart_after_commit": _restart(url, commit_first=True),
        }
    finally:
        if not args.keep:
            bench_claims._drop_db(base, name)
    doc = {
        "nodes": args.nodes,
        "slots": args.nodes * 8,
        "allocations_placed": len(placed),
        **setup,
        "capacity_cold_s": round(cold, 2),
        **restart,
        **results,
        "database": "scratch " + ("(kept) " + url if args.keep else "(dropped)"),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"serve bench: {doc['nodes']} nodes ({doc['slots']} slots), {doc['allocations_placed']} allocations "
            f"placed (sync {setup['sync_s']}s, placing {setup['place_s']}s)"
        )
        print(f"  capacity, first request (computes the model)  {doc['capacity_cold_s']} s")
        for key, label in (
            ("capacity_restart", "after a restart"),
            ("capacity_restart_after_commit", "after a commit and a restart"),
        ):
            r = doc[key]
            print(f"  capacity ready {label:<31} {r['s']} s (stale: {r['stale']}; serving after {r['ready_line_s']} s)")
        for key, label in (
            ("allocation", "GET /api/v1/allocations/{id}"),
            ("capacity_warm", "GET /api/v1/capacity"),
            ("dashboard", "GET / (dashboard)"),
            ("node_page", "GET /nodes/{name}"),
            ("dashboard_search", "GET /?q=node-NNNNN (search)"),
            ("dashboard_tenant", "GET /?tenant=tenant-N"),
            ("allocation_page", "GET /allocations/{id}"),
            ("metrics", "GET /metrics"),
        ):
            s = results[key]
            print(f"  {label:<46} p50 {s['p50_ms']:>9} ms  p95 {s['p95_ms']:>9} ms  (n={s['n']})")
    return 0
