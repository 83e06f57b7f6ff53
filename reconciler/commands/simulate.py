"""`gpuaas simulate`: replay a workload CSV through the real planner engine.

    gpuaas simulate --fleet DIR --workload FILE.csv [--policy NAME] [--json] [--repack-bound]
    gpuaas simulate --fleet DIR --workload FILE.csv --compare [--json] [--lease-ends terms|none|exact]

The CSV header is `arrival_s,duration_s,sku,gpus[,lease_s]` (`gpuaas fleet
workload` writes one). A request arrives, holds its GPUs for `duration_s`,
then is released; a rejected request is dropped, not queued. `lease_s`, when
a row has one, is the lease term the portal sent (an upper bound: the
allocation leaves at `lease_s` if it runs to term); a row without one is an
on-demand lease. `--lease-ends` says what the planner is told (only `default`
reads it): `terms` (default) the rows' `lease_s`, `none` nothing (every
lease on demand; `--no-lease-ends` is the same), `exact` the real departure
(an oracle, for research). `--compare` also shows the repack bound beside
the fluid bound. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.errors import UsageError

WORKLOAD_LIMIT = 1024 * 1024 * 1024  # a CSV of millions of requests; never an endless device

if TYPE_CHECKING:
    from reconciler.placement import simulation


def register(sub: Any) -> None:
    from policies import packing
    from reconciler.placement import simulation
    p = sub.add_parser("simulate", help="replay a workload through the placement engine")
    p.add_argument("--fleet", type=Path, required=True, help="desired-state directory")
    p.add_argument("--workload", type=Path, required=True, help="CSV: arrival_s,duration_s,sku,gpus[,lease_s]")
    p.add_argument("--policy", choices=[x.value for x in packing.ALL],
                   help="placement policy (default: the fleet's placement.policy)")
    p.add_argument("--compare", action="store_true", help="run every policy on the same workload")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--region", help="region the requests ask for (default: the fleet's first)")
    p.add_argument("--lease-ends", choices=[x.value for x in simulation.LeaseEnds],
                   default=simulation.LeaseEnds.TERMS.value,
                   help="what the planner is told of lease ends: terms = the rows' lease_s (default), "
                        "none = every lease on demand, exact = the real departure (an oracle, research only)")
    p.add_argument("--no-lease-ends", dest="lease_ends", action="store_const", const=simulation.LeaseEnds.NONE.value,
                   help="same as --lease-ends none")
    p.add_argument("--repack-bound", action="store_true",
                   help="also compute the repack bound (always with --compare)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)


def _rows(path: Path) -> list[Any]:
    from reconciler.placement import simulation, synthesis
    from schemas import inputfiles
    from schemas.errors import PermanentError

    try:
        text = inputfiles.read_text(path, limit=WORKLOAD_LIMIT, code="simulate.workload.unreadable", what="workload")
    except PermanentError as e:
        raise UsageError(e.message, code=e.code) from e
    try:
        with io.StringIO(text, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = set(synthesis.WORKLOAD_HEADER) - set(reader.fieldnames or ())
            if missing:
                raise UsageError(f"{path}: missing column(s) {', '.join(sorted(missing))}",
                                 code="simulate.workload.header")
            return simulation.read_rows(reader)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}", code="simulate.workload.unreadable") from e
    except ValueError as e:
        raise UsageError(f"{path}: {e}", code="simulate.workload.row") from e


def _progress(label: str) -> simulation.Progress:
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
    from policies import packing
    from reconciler import sources
    from reconciler.placement import simulation
    result = sources.load(args.fleet)
    if result.errors:
        raise UsageError(f"{args.fleet} does not validate ({len(result.errors)} errors); run gpuaas validate",
                         code="simulate.fleet.invalid")
    rows = _rows(args.workload)
    if not rows:
        raise UsageError(f"{args.workload}: no requests", code="simulate.workload.empty")
    policies = [p.value for p in packing.ALL] if args.compare else [args.policy]
    repack = None
    if args.compare or args.repack_bound:
        repack = simulation.repack_bound(result.state, rows, region=args.region,
                                         progress=None if args.quiet else _progress("repack bound"))
    results = []
    for name in policies:
        label = name or (result.state.fleet.placement.policy if result.state.fleet else "default")
        progress = None if args.quiet else _progress(label)
        results.append(simulation.simulate(result.state, rows, policy=name, progress=progress,
                                           region=args.region, lease_ends=simulation.LeaseEnds(args.lease_ends),
                                           repack_bound_gpu=repack))
    if args.json:
        doc: Any = results[0].as_dict() if not args.compare else {
            "workload": str(args.workload), "fleet": str(args.fleet),
            "results": [r.as_dict() for r in results],
        }
        print(json.dumps(doc, indent=2))
    else:
        print(render(results))
    return 0


def render(results: list[simulation.Result]) -> str:
    from policies import packing
    from reconciler.placement import simulation
    lease_words = {
        simulation.LeaseEnds.TERMS.value: "the rows' lease_s terms",
        simulation.LeaseEnds.NONE.value: "none (every lease on demand)",
        simulation.LeaseEnds.EXACT.value: "exact departures (oracle)",
    }
    first = results[0]
    told = lease_words.get(first.lease_mode, first.lease_mode)
    if first.lease_mode == simulation.LeaseEnds.TERMS.value and not first.lease_ends:
        told = "none (no row has lease_s: every lease on demand)"
    repack = first.repack_bound_gpu is not None
    lines = [
        f"{first.offered_requests} requests, {first.offered_gpus} GPUs offered to {first.nodes} nodes "
        f"({', '.join(f'{k}: {v} GPUs' for k, v in sorted(first.pool_gpus.items()))}); lease ends told: {told}",
        "",
        f"{'policy':<22} {'acceptance_gpu':>14} {'fluid_bound':>11} "
        + (f"{'repack_bound':>12} " if repack else "")
        + f"{'gap':>8} {'accepted':>9} {'rej_w_cap':>9} {'empty_nodes':>11} {'placements/s':>12}",
    ]
    for r in results:
        lines.append(
            f"{r.policy:<22} {r.acceptance_gpu:>14.4f} {r.fluid_bound_gpu:>11.4f} "
            + (f"{r.repack_bound_gpu:>12.4f} " if r.repack_bound_gpu is not None else "")
            + f"{r.gap:>8.4f} {r.accepted_requests:>9} {r.rejected_with_capacity:>9} "
            f"{r.mean_empty_nodes:>11.1f} {r.placements_per_second:>12.0f}"
        )
    if len(results) > 1:
        base = [r for r in results if r.policy != packing.Policy.DEFAULT.value]
        mine = [r for r in results if r.policy == packing.Policy.DEFAULT.value]
        if base and mine:
            best = max(base, key=lambda r: r.acceptance_gpu)
            ratio = mine[0].gap / best.gap if best.gap > 0 else float("nan")
            closed = 1 - ratio if best.gap > 0 else float("nan")
            lines += ["", f"default vs best baseline ({best.policy}): acceptance "
                          f"{mine[0].acceptance_gpu - best.acceptance_gpu:+.4f}, gap ratio {ratio:.2f} "
                          f"(closes {closed:.0%} of its gap to the fluid bound)"]
    return "\n".join(lines)
