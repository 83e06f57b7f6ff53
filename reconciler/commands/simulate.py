"""`gpuaas simulate`: replay a workload CSV through the real planner engine.

    gpuaas simulate --fleet DIR --workload FILE.csv [--policy NAME] [--json]
    gpuaas simulate --fleet DIR --workload FILE.csv --compare [--json] [--no-lease-ends]

The CSV header is `arrival_s,duration_s,sku,gpus` (`gpuaas fleet workload`
writes one). A request arrives, holds its GPUs for `duration_s`, then is
released; a rejected request is dropped, not queued. `duration_s` is also the
lease term the request carries (what `Allocation.lease_hours` tells the
planner; only `default` reads it); `--no-lease-ends` replays every request as
an on-demand lease with no known end. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from policies import packing
from reconciler import simulating, sources
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("simulate", help="replay a workload through the placement engine")
    p.add_argument("--fleet", type=Path, required=True, help="desired-state directory")
    p.add_argument("--workload", type=Path, required=True, help="CSV: arrival_s,duration_s,sku,gpus")
    p.add_argument("--policy", choices=[x.value for x in packing.ALL],
                   help="placement policy (default: the fleet's placement.policy)")
    p.add_argument("--compare", action="store_true", help="run every policy on the same workload")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--region", help="region the requests ask for (default: the fleet's first)")
    p.add_argument("--no-lease-ends", dest="lease_ends", action="store_false",
                   help="requests carry no lease end (on-demand leases); default: duration_s is the lease term")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _rows(path: Path) -> list[Any]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = {"arrival_s", "duration_s", "sku", "gpus"} - set(reader.fieldnames or ())
            if missing:
                raise UsageError(f"{path}: missing column(s) {', '.join(sorted(missing))}",
                                 code="simulate.workload.header")
            return simulating.read_rows(reader)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}", code="simulate.workload.unreadable") from e
    except ValueError as e:
        raise UsageError(f"{path}: {e}", code="simulate.workload.row") from e


def _progress(label: str) -> simulating.Progress:
    """Progress on stderr: a live line on a terminal, a line per 10% in logs."""
    live = sys.stderr.isatty()
    shown = [-1]

    def report(done: int, total: int) -> None:
        pct = 100 * done // total
        if live:
            end = "\n" if done >= total else ""
            print(f"\r  {label}: {done}/{total} requests ({pct}%)", end=end, file=sys.stderr, flush=True)
        elif pct // 10 > shown[0]:
            shown[0] = pct // 10
            print(f"  {label}: {done}/{total} requests ({pct}%)", file=sys.stderr, flush=True)
    return report


def run(args: argparse.Namespace) -> int:
    result = sources.load(args.fleet)
    if result.errors:
        raise UsageError(f"{args.fleet} does not validate ({len(result.errors)} errors); run gpuaas validate",
                         code="simulate.fleet.invalid")
    rows = _rows(args.workload)
    if not rows:
        raise UsageError(f"{args.workload}: no requests", code="simulate.workload.empty")
    policies = [p.value for p in packing.ALL] if args.compare else [args.policy]
    results = []
    for name in policies:
        label = name or (result.state.fleet.placement.policy if result.state.fleet else "default")
        progress = None if args.quiet else _progress(label)
        results.append(simulating.simulate(result.state, rows, policy=name, progress=progress,
                                           region=args.region, lease_ends=args.lease_ends))
    if args.json:
        doc: Any = results[0].as_dict() if not args.compare else {
            "workload": str(args.workload), "fleet": str(args.fleet),
            "results": [r.as_dict() for r in results],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(render(results))
    return 0


def render(results: list[simulating.Result]) -> str:
    first = results[0]
    lines = [
        f"{first.offered_requests} requests, {first.offered_gpus} GPUs offered to {first.nodes} nodes "
        f"({', '.join(f'{k}: {v} GPUs' for k, v in sorted(first.pool_gpus.items()))}); "
        f"lease ends {'known (duration_s)' if first.lease_ends else 'unknown (--no-lease-ends)'}",
        "",
        f"{'policy':<22} {'acceptance_gpu':>14} {'fluid_bound':>11} {'gap':>8} {'accepted':>9} "
        f"{'rej_w_cap':>9} {'empty_nodes':>11} {'placements/s':>12}",
    ]
    for r in results:
        lines.append(
            f"{r.policy:<22} {r.acceptance_gpu:>14.4f} {r.fluid_bound_gpu:>11.4f} {r.gap:>8.4f} "
            f"{r.accepted_requests:>9} {r.rejected_with_capacity:>9} {r.mean_empty_nodes:>11.1f} "
            f"{r.placements_per_second:>12.0f}"
        )
    if len(results) > 1:
        base = [r for r in results if r.policy != packing.Policy.DEFAULT.value]
        mine = [r for r in results if r.policy == packing.Policy.DEFAULT.value]
        if base and mine:
            best = max(base, key=lambda r: r.acceptance_gpu)
            ratio = mine[0].gap / best.gap if best.gap > 0 else float("nan")
            lines += ["", f"default vs best baseline ({best.policy}): acceptance "
                          f"{mine[0].acceptance_gpu - best.acceptance_gpu:+.4f}, gap ratio {ratio:.2f}"]
    return "\n".join(lines)
