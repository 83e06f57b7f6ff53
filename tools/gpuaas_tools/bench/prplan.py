"""`gpuaas bench prplan --nodes 10000`: a CI job's `gpuaas plan --offline` of a PR adding one request.

Builds a synthetic fleet repo (`gpuaas fleet synth`'s documents) in a temp
dir and commits it as the base; every run plans a new head, a child of base
that adds one allocation as the portal bot writes it, so nothing is ever a
replay of a finished plan. Each plan is a separate `gpuaas plan` process,
timed from spawn to exit, its peak RSS read from `wait4`:

- `no_cache`: `--no-cache` (a CI runner that keeps no cache);
- `fresh_dir`: an empty `--cache-dir` (the cache is written for a next run);
- `second`: a cache that planned this base once: this run keeps base's
  world (`reconciler.caches.keptworlds`);
- `cached`: a cache holding base's world (every later PR against base).

Each `cached` plan's stdout must equal the `no_cache` plan's of the same
head, or the bench fails. Goals (issue 10): no cache <= 5 s, cached <= 1 s
at 10,000 nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpuaas_tools.bench.gitops import GIT_ENV
from schemas.errors import UsageError

GOAL_NO_CACHE_S = 5.0
GOAL_CACHED_S = 1.0


def register(sub: Any) -> None:
    p = sub.add_parser("prplan", help="offline PR plan of one new request: no cache, fresh cache, kept base")
    p.add_argument("--nodes", type=int, default=10_000, help="hosts in the synthetic fleet (default 10000)")
    p.add_argument("--runs", type=int, default=5, help="plans per case, each of a new head (default 5)")
    p.add_argument("--keep", action="store_true", help="keep the temp repo and caches (their path is printed)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (times, p50, peak RSS per case)")
    p.set_defaults(func=run)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True, env={**os.environ, **GIT_ENV}
    )
    return done.stdout.strip()


def _build(root: Path, nodes: int) -> str:
    """The synthetic fleet committed as base; its commit id."""
    from reconciler.commands import fleet

    with contextlib.redirect_stdout(sys.stderr):  # its "wrote N files" is not the bench's output
        fleet.run_synth(argparse.Namespace(nodes=nodes, out=root, amd_share=0.0, seed=0, force=False))
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base fleet")
    return _git(root, "rev-parse", "HEAD")


def _new_head(root: Path, base: str, n: int) -> str:
    """A child of base adding allocation `bench-<n>` (2 GPUs), the document the portal bot writes.

    Written without the bot's own check of the whole repo: this process stays
    small, and every plan process it starts reports its own peak memory.
    """
    from reconciler.placement import synthesis
    from reconciler.reconcile import requests

    _git(root, "checkout", "-q", "--detach", base)
    data = requests.render_request(
        allocation_id=f"bench-{n}",
        tenant="bench",
        sku=synthesis.H200_SLICE,
        gpus=2,
        region=synthesis.REGION,
        image=None,
        ssh_keys=[],
        requested_at=dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=n),
    )
    path = root / requests.ALLOCATIONS_DIR / f"bench-{n}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", f"bench-{n}")
    head = _git(root, "rev-parse", "HEAD")
    _git(root, "checkout", "-q", "--detach", base)
    return head


# Runs one plan as its child and reports it: a plan forked from this small process starts with
# its memory, not with the bench's (Linux counts a forked child's peak from its parent's size).
_MEASURE = (
    "import resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "rc = subprocess.run(sys.argv[1:], stderr=subprocess.DEVNULL, check=False).returncode\n"
    "took = time.perf_counter() - start\n"
    "print(rc, took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
)


def _plan(root: Path, base: str, head: str, *flags: str) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MiB) and stdout of one `gpuaas plan` process."""
    argv = [
        sys.executable,
        "-m",
        "reconciler.cli",
        "plan",
        str(root),
        "--offline",
        "--base",
        base,
        "--head",
        head,
        "-o",
        "json",
        *flags,
    ]
    done = subprocess.run([sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, check=False)
    try:
        rc, took, peak_kib = done.stderr.split()[-3:]
        if int(rc) not in (0, 2):
            raise ValueError(f"exit {rc}")
    except ValueError as e:
        raise UsageError(f"gpuaas plan failed ({e}): {' '.join(argv)}", code="bench.plan_failed") from e
    return float(took), int(peak_kib) / 1024, done.stdout


def _case(times: list[float], rss: list[float]) -> dict[str, Any]:
    return {
        "times_s": [round(t, 3) for t in times],
        "p50_s": round(statistics.median(times), 3),
        "max_s": round(max(times), 3),
        "peak_rss_mib": round(max(rss), 1),
    }


def measure(root: Path, base: str, *, runs: int, work: Path, say: Any) -> dict[str, Any]:
    heads = iter(range(1, 10_000))
    cases: dict[str, tuple[list[float], list[float]]] = {
        k: ([], []) for k in ("no_cache", "fresh_dir", "second", "cached")
    }
    seen_rss: dict[str, list[float]] = {}

    def record(case: str, took: float, rss: float) -> None:
        cases[case][0].append(took)
        cases[case][1].append(rss)
        seen_rss.setdefault(case, []).append(rss)
        say(f"  {case:<10} {took:6.2f} s  {rss:7.1f} MiB")

    kept = work / "kept"
    for i in range(runs):
        head = _new_head(root, base, next(heads))
        took, rss, _ = _plan(root, base, head, "--no-cache")
        record("no_cache", took, rss)
        fresh = work / f"fresh-{i}"
        took, rss, _ = _plan(root, base, head, "--cache-dir", str(fresh))
        record("fresh_dir", took, rss)
        if i == 0:
            shutil.copytree(fresh, kept)  # a cache that planned base once
            took, rss, _ = _plan(root, base, _new_head(root, base, next(heads)), "--cache-dir", str(kept))
            record("second", took, rss)
        shutil.rmtree(fresh)
    same = True
    for _ in range(runs):
        head = _new_head(root, base, next(heads))
        took, rss, printed = _plan(root, base, head, "--cache-dir", str(kept))
        record("cached", took, rss)
        same = same and printed == _plan(root, base, head, "--no-cache")[2]
    if not same:
        raise UsageError("a plan from the kept base printed other than --no-cache", code="bench.output_differs")
    result = {name: _case(*values) for name, values in cases.items()}
    return {
        **result,
        "same_output": same,
        "goal_no_cache_s": GOAL_NO_CACHE_S,
        "goal_cached_s": GOAL_CACHED_S,
        "goal_met": result["no_cache"]["p50_s"] <= GOAL_NO_CACHE_S and result["cached"]["p50_s"] <= GOAL_CACHED_S,
    }


def run(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.runs < 1:
        raise UsageError("--nodes and --runs must be at least 1")
    work = Path(tempfile.mkdtemp(prefix="gpuaas-bench-prplan-"))
    say = (lambda _text: None) if args.json else print
    try:
        root = work / "repo"
        say(f"building a {args.nodes}-node fleet repo in {root} ...")
        base = _build(root, args.nodes)
        out = {
            "nodes": args.nodes,
            "runs": args.runs,
            "files": args.nodes * 2 + 5,
            **measure(root, base, runs=args.runs, work=work, say=say),
        }
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for case in ("no_cache", "fresh_dir", "second", "cached"):
            c = out[case]
            print(f"{case:<10} p50 {c['p50_s']:.2f} s  max {c['max_s']:.2f} s  peak RSS {c['peak_rss_mib']:.0f} MiB")
        print(
            f"goal (no cache <= {GOAL_NO_CACHE_S} s, cached <= {GOAL_CACHED_S} s): "
            f"{'met' if out['goal_met'] else 'NOT met'}; outputs equal: {out['same_output']}"
        )
    return 0 if out["goal_met"] else 1
