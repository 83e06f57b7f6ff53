"""`gpuaas bench portal [--requests N] [--interval S] [--json]`: the portal's path, end to end, on real parts.

A scratch database with the example fleet applied; a bare git remote
holding the fleet; `gpuaas serve --intake-repo` (in this process) on a
clone of it; `gpuaas run --remote origin --branch main --interval S` (its own
process) reconciling what lands on the remote; one SSE client on
/api/v1/events. The bench POSTs N one-GPU requests one after another and
measures:

- intake -> commit pushed: the POST's round trip (the 202 comes after the
  bot's commit is on the remote);
- commit -> `reserved` event: from the 202 to the SSE client receiving that
  allocation's `provisioning.requested` event; this includes the loop's
  poll of the remote (on average half of --interval).

The figures are p50 and max over N; the default fleet has room for the
default N (one-GPU slices in us-east-1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from reconciler.commands import db
from schemas.errors import UsageError

# The example fleet the demo ships (a link to examples/fleet in a checkout, the files in a wheel).
EXAMPLE = (Path(__file__).resolve().parents[1] / "demo" / "example-fleet").resolve()
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa bench@portal"


def register(sub: Any) -> None:
    p = sub.add_parser("portal", help="intake -> commit pushed, commit -> reserved event (real git, run, SSE)")
    p.add_argument("--requests", type=int, default=8, help="requests, one after another (default 8)")
    p.add_argument("--interval", type=float, default=0.5, metavar="S", help="gpuaas run's remote poll (default 0.5)")
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def _repos(tmp: Path) -> tuple[Path, Path, Path]:
    seed = tmp / "seed"
    shutil.copytree(EXAMPLE, seed)
    _git(seed, "init", "-q", "-b", "main")
    _git(seed, "add", "-A")
    _git(seed, "commit", "-qm", "fleet")
    remote = tmp / "remote.git"
    _git(tmp, "clone", "-q", "--bare", str(seed), str(remote))
    _git(tmp, "clone", "-q", str(remote), str(tmp / "intake"))
    _git(tmp, "clone", "-q", str(remote), str(tmp / "loop"))
    return remote, tmp / "intake", tmp / "loop"


def _listen(url: str, seen: dict[str, float], ready: threading.Event, stop: threading.Event) -> None:
    import httpx

    with httpx.Client(timeout=httpx.Timeout(10, read=None)) as c, c.stream("GET", url + "/api/v1/events") as r:
        ready.set()
        for line in r.iter_lines():
            if stop.is_set():
                return
            if line.startswith("data:"):
                doc = json.loads(line[5:])
                if doc.get("state") == "reserved":
                    seen.setdefault(doc["allocation_id"], time.monotonic())


def _stats(values: list[float]) -> dict[str, float]:
    return (
        {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1)}
        if values
        else {"n": 0}
    )


def run(args: argparse.Namespace) -> int:  # noqa: PLR0912, PLR0915 - one linear scenario
    import httpx

    from gpuaas_tools.bench import claims as bench_claims
    from reconciler import cli
    from reconciler.service import server

    if args.requests < 1 or args.interval <= 0:
        raise UsageError("--requests and --interval must be positive", code="bench.portal.usage")
    base = db.database_url(args)
    name = f"gpuaas_bench_portal_{os.getpid()}"
    bench_claims._create_db(base, name)
    url = bench_claims._scratch_url(base, name)
    tmp = Path(tempfile.mkdtemp(prefix="gpuaas-bench-portal-"))
    loop: subprocess.Popen[bytes] | None = None
    try:
        with open(os.devnull, "w") as quiet:
            import contextlib

            with contextlib.redirect_stdout(quiet):
                if cli.main(["apply", str(EXAMPLE), "--db-url", url]) != 0:
                    raise UsageError("applying the example fleet failed", code="bench.portal.setup")
        _remote, intake_repo, loop_repo = _repos(tmp)
        loop = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler.cli",
                "run",
                str(loop_repo),
                "--remote",
                "origin",
                "--branch",
                "main",
                "--interval",
                str(args.interval),
                "--db-url",
                url,
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "run.log").open("wb"),
        )
        httpd = server.make_server(
            url, server.Settings(port=0, intake_repo=intake_repo, intake_push=("origin", "main"))
        )
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        seen: dict[str, float] = {}
        ready, stop = threading.Event(), threading.Event()
        listener = threading.Thread(target=_listen, args=(httpd.url, seen, ready, stop), daemon=True)
        listener.start()
        ready.wait(30)
        pushed: list[float] = []
        reserved: list[float] = []
        try:
            with httpx.Client(base_url=httpd.url, timeout=120) as c:
                for i in range(args.requests):
                    aid = f"bench-{i:04d}"
                    t0 = time.monotonic()
                    r = c.post(
                        "/api/v1/allocations",
                        json={
                            "id": aid,
                            "tenant": "hooli",
                            "sku": "h200-sxm-slice",
                            "region": "us-east-1",
                            "gpu_count": 1,
                            "ssh_keys": [KEY],
                        },
                    )
                    t1 = time.monotonic()
                    if r.status_code != 202:
                        raise UsageError(f"POST {aid}: {r.status_code} {r.text[:300]}", code="bench.portal.intake")
                    pushed.append(t1 - t0)
                    deadline = t1 + 60
                    while aid not in seen and time.monotonic() < deadline:
                        time.sleep(0.005)
                    if aid in seen:
                        reserved.append(seen[aid] - t1)
        finally:
            stop.set()
            httpd.shutdown()
            httpd.server_close()
            httpd.service.close()
    finally:
        if loop is not None:
            loop.terminate()
            loop.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
        bench_claims._drop_db(base, name)
    doc = {
        "requests": args.requests,
        "run_interval_s": args.interval,
        "intake_to_pushed": _stats(pushed),
        "commit_to_reserved_event": _stats(reserved),
        "reserved_missing": args.requests - len(reserved),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"portal bench: {args.requests} requests, gpuaas run polling the remote every {args.interval:g}s")
        for key, label in (
            ("intake_to_pushed", "POST -> commit pushed (202)"),
            ("commit_to_reserved_event", "commit -> reserved event (SSE)"),
        ):
            s = doc[key]
            print(f"  {label:<34} p50 {s.get('p50_ms', '-'):>8} ms  max {s.get('max_ms', '-'):>8} ms  (n={s['n']})")
        if doc["reserved_missing"]:
            print(f"  {doc['reserved_missing']} request(s) saw no reserved event within 60 s")
    return 0
