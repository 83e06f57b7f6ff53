"""`gpuaas bench request`: time `gpuaas request create --commit` in a synthetic fleet repo of N nodes.

What the portal bot pays per request, end to end: a fresh `gpuaas` process
(interpreter and imports included), the request's validation and the git
commit. The fleet is `gpuaas fleet synth`'s (2 files per node), committed
once into a repo reused by later runs; each run writes a new allocation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("request", help="time `gpuaas request create --commit` in a synthetic fleet repo")
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--dir", type=Path, help="fleet repo to (re)use; default: a cache dir under /tmp")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _ensure_repo(root: Path, nodes: int) -> None:
    from gpuaas_tools.bench import validate

    if (root / ".git").exists():
        return
    validate._ensure_fleet(root, nodes)
    (root / ".complete").unlink()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    }
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True, env=env, timeout=600)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True, env=env, timeout=600)
    subprocess.run(["git", "commit", "-qm", "fleet"], cwd=root, check=True, env=env, timeout=600)


def run(args: argparse.Namespace) -> int:
    root = args.dir or Path(tempfile.gettempdir()) / f"gpuaas-bench-request-{args.nodes}"
    _ensure_repo(root, args.nodes)
    timings = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "reconciler.cli",
                "request",
                "create",
                f"--repo={root}",
                "--tenant",
                "bench",
                "--sku",
                "h200-sxm-slice",
                "--gpus",
                "1",
                "--region",
                "synth-1",
                "--commit",
                "-o",
                "json",
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        timings.append(time.perf_counter() - start)
    doc = {
        "nodes": args.nodes,
        "runs": args.runs,
        "seconds_best": round(min(timings), 2),
        "seconds_median": round(sorted(timings)[len(timings) // 2], 2),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(doc))
    else:
        print(
            f"request create --commit at {doc['nodes']} nodes: best {doc['seconds_best']} s, "
            f"median {doc['seconds_median']} s over {args.runs} runs (load {doc['load_average_1m']})"
        )
    return 0
