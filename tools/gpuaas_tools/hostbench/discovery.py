"""`gpuaas bench discover`: how long discovery of one 8-GPU host takes.

Times each phase the host reconciler and `gpuaas host discover` run: reading
the sysfs root, building the candidate map, rendering it as YAML, and the
approval gate against the candidate itself. The goal (issue 6) is at most
200 ms for the whole of discovery of an 8-GPU host.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from schemas.errors import UsageError

GOAL_MS = 200.0
DEFAULT_TREE = "xe9680l-h200"  # under <examples>/sysfs/, built there by build.py


def register(sub: Any) -> None:
    p = sub.add_parser("discover", help="time host discovery on a recorded 8-GPU host (goal <= 200 ms)")
    p.add_argument(
        "--sysfs-root",
        type=Path,
        default=None,
        metavar="DIR",
        help="host root to discover (default: the recorded XE9680L H200 tree under --examples)",
    )
    # Given, not found from this file's place: an installed wheel has no examples/ beside it.
    p.add_argument(
        "--examples",
        type=Path,
        default=Path("examples"),
        metavar="DIR",
        help="the repository's examples/ holding sysfs/build.py and the recorded trees (default: %(default)s)",
    )
    p.add_argument("--runs", type=int, default=50, help="timed runs after the first (default: %(default)s)")
    p.set_defaults(func=run)


def _ms(ns: int) -> float:
    return ns / 1e6


def _build_default(examples: Path, into: Path) -> Path:
    """Build the recorded tree with <examples>/sysfs/build.py when it is not built yet."""
    script = examples / "sysfs" / "build.py"
    spec = importlib.util.spec_from_file_location("gpuaas_sysfs_build", script)
    if spec is None or spec.loader is None or not script.is_file():
        raise UsageError(
            f"no recorded tree at {examples / 'sysfs' / DEFAULT_TREE} and no {script} to build it: "
            "pass --sysfs-root DIR (a host root) or --examples DIR (the repository's examples/)",
            code="bench.discover.no_tree",
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    host = next(h for h in module.hosts() if h.dirname == DEFAULT_TREE)
    root = into / DEFAULT_TREE
    module.build(host, root)
    return root


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UsageError("--runs must be at least 1")
    if args.sysfs_root is None:
        args.sysfs_root = args.examples / "sysfs" / DEFAULT_TREE
        if not args.sysfs_root.is_dir():
            with tempfile.TemporaryDirectory(prefix="gpuaas-bench-") as tmp:
                args.sysfs_root = _build_default(args.examples, Path(tmp))
                print(f"built the recorded tree in {args.sysfs_root} (build.py --help: build in place)")
                return _bench(args)
    if not args.sysfs_root.is_dir():
        raise UsageError(f"--sysfs-root {args.sysfs_root}: no such directory")
    return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    from host_reconciler.discovery import candidates, discovering, gating, rendering

    phases: dict[str, list[float]] = {
        "read sysfs": [],
        "candidate map": [],
        "render yaml": [],
        "gate": [],
        "total": [],
    }
    first = 0.0
    for i in range(args.runs + 1):
        t0 = time.perf_counter_ns()
        found = discovering.discover(args.sysfs_root)
        t1 = time.perf_counter_ns()
        cand = candidates.candidate_map(found, node="bench-node")
        t2 = time.perf_counter_ns()
        rendering.to_yaml(cand, found)
        t3 = time.perf_counter_ns()
        if cand.slot_map is not None:
            gating.gate(cand.slot_map.model_copy(update={"approval_required": False}), found)
        t4 = time.perf_counter_ns()
        if i == 0:
            first = _ms(t4 - t0)
            continue
        for name, ns in (
            ("read sysfs", t1 - t0),
            ("candidate map", t2 - t1),
            ("render yaml", t3 - t2),
            ("gate", t4 - t3),
            ("total", t4 - t0),
        ):
            phases[name].append(_ms(ns))
    print(
        f"discover {args.sysfs_root}: {len(found.gpus)} GPUs, {len(found.fabric)} fabric devices, "
        f"{sum(len(f.vfs) for f in found.fabric)} VFs, {len(found.nvme)} NVMe; "
        f"{args.runs} runs after 1 warm-up"
    )
    for name, values in phases.items():
        ordered = sorted(values)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        print(
            f"  {name:<14} median {statistics.median(values):7.2f} ms   p95 {p95:7.2f} ms   max {max(values):7.2f} ms"
        )
    total = statistics.median(phases["total"])
    verdict = "met" if max(total, first) <= GOAL_MS else "MISSED"
    print(f"  first run      {first:7.2f} ms")
    print(f"goal <= {GOAL_MS:.0f} ms per 8-GPU host: {verdict} (median {total:.2f} ms, first {first:.2f} ms)")
    return 0
