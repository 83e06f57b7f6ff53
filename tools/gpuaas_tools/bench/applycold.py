"""`gpuaas bench apply`: a cold `gpuaas apply` beside `gpuaas validate` of the same tree, back to back.

Issue 31's goal: the first apply of a 10,000-node fleet into an empty store
costs at most 1.5 times validating the same tree. Each run, in a scratch
database made and migrated untimed (on the embedded server, or --db-url's):

1. `gpuaas validate PATH --no-cache`, a fresh process, timed;
2. `gpuaas apply PATH`, a fresh process, timed, into the empty database;

so the two figures of a run are taken in the same minute, under the same
load, and their ratio is what is judged (the median over runs). The fleet
(`bench gitops`'s synthetic writer) is committed in git once and reused
with --dir.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from reconciler.commands import db
from schemas.errors import PermanentError, UsageError

GOAL_RATIO = 1.5
_DONE = "gpuaas-bench-apply-nodes"  # in .git: the fleet under it is complete and committed


def register(sub: Any) -> None:
    p = sub.add_parser(
        "apply", help="cold apply of a synthetic fleet into an empty store, beside validate of the same tree"
    )
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", type=Path, help="fleet repo to (re)use; default: a new one under /tmp, removed after")
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def ensure_fleet(root: Path, nodes: int) -> None:
    """The synthetic fleet of `nodes` nodes, committed in a git repo at `root` (kept when already there)."""
    from gpuaas_tools.bench import gitops

    marker = root / ".git" / _DONE
    if marker.exists():
        if marker.read_text().strip() != str(nodes):
            raise UsageError(f"{root} holds a fleet of {marker.read_text().strip()} nodes, not {nodes}")
        return
    if root.exists() and any(root.iterdir()):
        raise UsageError(f"{root} is not empty and holds no fleet this benchmark wrote")
    gitops.write_fleet(root, nodes)
    gitops._git(root, "init", "-q", "-b", "main")
    gitops._git(root, "add", "-A")
    gitops._git(root, "commit", "-q", "-m", "bench fleet")
    marker.write_text(str(nodes))


def _timed(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=False)
    took = time.perf_counter() - started
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise PermanentError(f"{' '.join(argv[2:5])} exited {done.returncode}: {' | '.join(tail)}")
    return took


def one_run(base_url: str, root: Path) -> dict[str, float]:
    """validate, then apply into a fresh scratch database; seconds each and their ratio."""
    from psycopg import conninfo, sql

    from reconciler.store import connections, migrations
    from schemas import dberrors

    name = f"gpuaas_bench_apply_{uuid.uuid4().hex[:8]}"
    url = conninfo.make_conninfo(base_url, dbname=name)
    with connections.connect(base_url, autocommit=True) as conn, dberrors.wrapped("create scratch database"):
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with connections.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
        cli = [sys.executable, "-m", "reconciler.cli"]
        load = os.getloadavg()[0]
        path = str(root.resolve())  # absolute: never read as an option
        validate_s = _timed([*cli, "validate", "--no-cache", "--progress", "off", path])
        apply_s = _timed([*cli, "apply", "--progress", "off", f"--db-url={url}", path])
    finally:
        with connections.connect(base_url, autocommit=True) as conn, dberrors.wrapped("drop scratch database"):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return {
        "validate_s": round(validate_s, 3),
        "apply_s": round(apply_s, 3),
        "ratio": round(apply_s / validate_s, 2),
        "load_average_1m": round(load, 2),
    }


def run(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.nodes < 1:
        raise UsageError("--runs and --nodes must be at least 1")
    base = db.database_url(args)
    tmp = None if args.dir else Path(tempfile.mkdtemp(prefix="gpuaas-bench-apply-"))
    root = args.dir if tmp is None else tmp / "desired"
    try:
        ensure_fleet(root, args.nodes)
        runs = []
        for i in range(args.runs):
            runs.append(one_run(base, root))
            if not args.json:
                r = runs[-1]
                print(
                    f"  run {i + 1}: validate {r['validate_s']:.2f} s, apply {r['apply_s']:.2f} s, "
                    f"ratio {r['ratio']:.2f} (load avg {r['load_average_1m']})",
                    flush=True,
                )
    finally:
        if tmp is not None:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    ratio = statistics.median(r["ratio"] for r in runs)
    doc = {
        "nodes": args.nodes,
        "runs": runs,
        "median_ratio": round(ratio, 2),
        "goal_ratio": GOAL_RATIO,
        "goal_met": ratio <= GOAL_RATIO,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"cold apply / validate at {args.nodes} nodes: median ratio {doc['median_ratio']:.2f} over "
            f"{args.runs} runs; goal <= {GOAL_RATIO}: {'met' if doc['goal_met'] else 'NOT met'}"
        )
    return 0 if doc["goal_met"] else 1
