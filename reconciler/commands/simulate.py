"""`gpuaas simulate`: replay a workload CSV through the real planner engine.

    gpuaas simulate --fleet DIR --workload FILE.csv [--policy NAME] [--json] [--repack-bound] [--wait-s SECONDS]
    gpuaas simulate --fleet DIR --workload FILE.csv --compare [--json] [--lease-ends terms|none|exact]
    gpuaas simulate --suite [--json] [--seeds N] [--first-seed S] [--loads 0.8,0.9,1.0] [--requests N] [--families a,b]
                            [--lease-ends terms|none|exact] [--reserve-whole-host WINDOW_S:CAP[:AFTER]]
                            [--wait-s SECONDS] [--whole-host-reserve MAX_HOSTS[:AFTER_PENDING]]

The CSV header is `arrival_s,duration_s,sku,gpus[,lease_s]` (`gpuaas fleet
workload` writes one). A request arrives, holds its GPUs for `duration_s`,
then is released; a rejected request is dropped, not queued. `lease_s`, when
a row has one, is the lease term the portal sent (an upper bound: the
allocation leaves at `lease_s` if it runs to term); a row without one is an
on-demand lease. `--lease-ends` says what the planner is told (only `default`
reads it): `terms` (default) the rows' `lease_s`, `none` nothing (every
lease on demand; `--no-lease-ends` is the same), `exact` the real departure
(an oracle, for research). `--reserve-whole-host` (research, `default`
only) refuses a small request that would open one of the last empty hosts
while whole-host requests were lately refused (`reserving`); `pending:CAP`
counts whole-host requests pending now instead and needs `--wait-s`.
`--whole-host-reserve MAX_HOSTS[:AFTER_PENDING]` sets the product's
`fleet.placement.whole_host_reserve` on the simulated fleet (a `--fleet`
that has it runs it without the flag): `default` then holds small requests
by the planner's own rule (`reserving.Holding`). It needs `--wait-s`: in
the loss model nothing waits, so the planner's reserve would hold nothing.
`--wait-s SECONDS` replays the product's queue instead of the loss model: a
refused request stays pending and is retried oldest first at every later
arrival and departure until it has waited SECONDS, then is dropped
(`simulation`, "Wait and retry"). `--compare` also shows the repack bound beside
the fluid bound. `--suite` replays every family of the workload suite
(`reconciler.placement.suite`, docs/placement.md "Workload suite") on a
synthetic 64-node fleet under every policy and exits 1 when `default`
accepts fewer GPUs than a baseline on some family and load. Progress goes
to stderr.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import codes as reconciler_codes
from schemas.errors import UsageError

WORKLOAD_LIMIT = 1024 * 1024 * 1024  # a CSV of millions of requests; never an endless device

if TYPE_CHECKING:
    from desired import models as m
    from reconciler.placement import simulation
    from reconciler.placement.reserving import Reserve


def register(sub: Any) -> None:
    from policies import packing
    from reconciler.placement import simulation

    p = sub.add_parser("simulate", help="replay a workload through the placement engine")
    p.add_argument("--fleet", type=Path, help="desired-state directory (required unless --suite)")
    p.add_argument("--workload", type=Path, help="CSV: arrival_s,duration_s,sku,gpus[,lease_s] (unless --suite)")
    p.add_argument(
        "--policy",
        choices=[x.value for x in packing.ALL],
        help="placement policy (default: the fleet's placement.policy)",
    )
    p.add_argument("--compare", action="store_true", help="run every policy on the same workload")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--region", help="region the requests ask for (default: the fleet's first)")
    p.add_argument(
        "--lease-ends",
        choices=[x.value for x in simulation.LeaseEnds],
        default=simulation.LeaseEnds.TERMS.value,
        help="what the planner is told of lease ends: terms = the rows' lease_s (default), "
        "none = every lease on demand, exact = the real departure (an oracle, research only); --suite too",
    )
    p.add_argument(
        "--no-lease-ends",
        dest="lease_ends",
        action="store_const",
        const=simulation.LeaseEnds.NONE.value,
        help="same as --lease-ends none",
    )
    p.add_argument(
        "--reserve-whole-host",
        metavar="WINDOW_S:CAP[:AFTER]",
        help="research: default refuses a small request that would open one of the last R empty hosts, "
        "R = min(CAP, whole-host requests refused in the last WINDOW_S seconds - (AFTER - 1)); --suite too",
    )
    p.add_argument(
        "--whole-host-reserve",
        metavar="MAX_HOSTS[:AFTER_PENDING]",
        help="set the fleet's placement.whole_host_reserve: default keeps min(MAX_HOSTS, whole-host requests "
        "waiting - (AFTER_PENDING - 1)) empty hosts per pool from smaller requests, by the planner's rule; "
        "needs --wait-s; --suite too",
    )
    p.add_argument(
        "--wait-s",
        metavar="SECONDS",
        help="wait and retry: a refused request stays pending, retried oldest first at each arrival and departure, "
        "and is dropped after SECONDS (the product's pending deadline; 0 = the loss model); --suite too",
    )
    p.add_argument("--repack-bound", action="store_true", help="also compute the repack bound (always with --compare)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--suite",
        action="store_true",
        help="run the workload suite (every family x load x seed, every policy) on a synthetic fleet",
    )
    p.add_argument("--seeds", type=int, default=3, help="--suite: streams per family and load (default 3)")
    p.add_argument(
        "--first-seed", type=int, default=1, help="--suite: seed of the first stream (default 1; 7+ are fresh streams)"
    )
    p.add_argument("--loads", default="0.8,0.9,1.0", help="--suite: offered loads (default 0.8,0.9,1.0)")
    p.add_argument("--requests", type=int, default=20000, help="--suite: requests per stream (default 20000)")
    p.add_argument("--families", help="--suite: comma-separated family names (default: all)")
    p.add_argument("--nodes", type=int, default=64, help="--suite: hosts of the synthetic fleet (default 64)")
    p.set_defaults(func=run)


def _rows(path: Path) -> list[Any]:
    from reconciler.placement import simulation, synthesis
    from schemas import inputfiles
    from schemas.errors import PermanentError

    try:
        text = inputfiles.read_text(
            path, limit=WORKLOAD_LIMIT, code=reconciler_codes.SIMULATE_WORKLOAD_UNREADABLE, what="workload"
        )
    except PermanentError as e:
        raise UsageError(e.message, code=e.code) from e
    try:
        with io.StringIO(text, newline="") as handle:
            reader = csv.DictReader(handle)
            missing = set(synthesis.WORKLOAD_HEADER) - set(reader.fieldnames or ())
            if missing:
                raise UsageError(
                    f"{path}: missing column(s) {', '.join(sorted(missing))}",
                    code=reconciler_codes.SIMULATE_WORKLOAD_HEADER,
                )
            return simulation.read_rows(reader)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}", code=reconciler_codes.SIMULATE_WORKLOAD_UNREADABLE) from e
    except ValueError as e:
        raise UsageError(f"{path}: {e}", code=reconciler_codes.SIMULATE_WORKLOAD_ROW) from e


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
    from reconciler.placement import reserving, simulation

    reserve = _reserve(args)
    wait_s = _wait(args, reserve)
    whole = _whole_host_reserve(args, reserve, wait_s)
    if args.suite:
        return run_suite(args, reserve, wait_s, whole)
    if args.fleet is None or args.workload is None:
        raise UsageError(
            "--fleet and --workload are required (or --suite)", code=reconciler_codes.SIMULATE_ARGS_MISSING
        )
    result = sources.load(args.fleet)
    if result.errors:
        raise UsageError(
            f"{args.fleet} does not validate ({len(result.errors)} errors); run gpuaas validate",
            code=reconciler_codes.SIMULATE_FLEET_INVALID,
        )
    state = result.state
    if whole is not None:
        reserving.set_on_fleet(state, whole)
    elif reserve is not None and state.fleet is not None and state.fleet.placement.whole_host_reserve is not None:
        raise UsageError(
            f"--reserve-whole-host: {args.fleet} sets placement.whole_host_reserve; run one reserve at a time",
            code=reconciler_codes.SIMULATE_RESERVE,
        )
    rows = _rows(args.workload)
    if not rows:
        raise UsageError(f"{args.workload}: no requests", code=reconciler_codes.SIMULATE_WORKLOAD_EMPTY)
    policies = [p.value for p in packing.ALL] if args.compare else [args.policy]
    repack = None
    # The repack bound is the loss model's (a request dropped unless everything, moved, fits): beside a
    # wait-and-retry replay it would read as a bound it is not, so it is left out there.
    if (args.compare or args.repack_bound) and wait_s is None:
        repack = simulation.repack_bound(
            state, rows, region=args.region, progress=None if args.quiet else _progress("repack bound")
        )
    results = []
    for name in policies:
        label = name or (result.state.fleet.placement.policy if result.state.fleet else "default")
        progress = None if args.quiet else _progress(label)
        results.append(
            simulation.simulate(
                state,
                rows,
                policy=name,
                progress=progress,
                region=args.region,
                lease_ends=simulation.LeaseEnds(args.lease_ends),
                repack_bound_gpu=repack,
                reserve=reserve,
                wait_s=wait_s,
            )
        )
    if args.json:
        doc: Any = (
            results[0].as_dict()
            if not args.compare
            else {
                "workload": str(args.workload),
                "fleet": str(args.fleet),
                "results": [r.as_dict() for r in results],
            }
        )
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
    if first.wait_s is not None:
        lines += [
            "",
            f"wait and retry: refused requests wait up to {first.wait_s:g} s "
            "(fluid_bound: a fluid queue; no repack bound, which is the loss model's)",
        ]
        lines += [
            f"{r.policy:<22} {r.expired_requests} expired, {r.waited_requests} placed after waiting, "
            f"wait mean {r.mean_wait_s:.0f} s, p95 {r.p95_wait_s:.0f} s, {r.gpu_seconds:.0f} GPU-seconds"
            for r in results
        ]
    if len(results) > 1:
        base = [r for r in results if r.policy != packing.Policy.DEFAULT.value]
        mine = [r for r in results if r.policy == packing.Policy.DEFAULT.value]
        if base and mine:
            best = max(base, key=lambda r: r.acceptance_gpu)
            ratio = mine[0].gap / best.gap if best.gap > 0 else float("nan")
            closed = 1 - ratio if best.gap > 0 else float("nan")
            lines += [
                "",
                f"default vs best baseline ({best.policy}): acceptance "
                f"{mine[0].acceptance_gpu - best.acceptance_gpu:+.4f}, gap ratio {ratio:.2f} "
                f"(closes {closed:.0%} of its gap to the fluid bound)",
            ]
    lines += [
        f"{r.policy} held back {r.held_for_reserve} small request(s) for --reserve-whole-host {r.reserve} (research)"
        for r in results
        if r.reserve is not None
    ]
    lines += [
        f"{r.policy} held back {r.held_for_reserve} small request(s) for placement.whole_host_reserve "
        f"{r.whole_host_reserve} (the planner's rule)"
        for r in results
        if r.whole_host_reserve is not None
    ]
    return "\n".join(lines)


def _suite_progress(quiet: bool) -> Any:
    """Progress of a suite run on stderr: a live line on a terminal, a line per 5% in logs."""
    if quiet:
        return None
    live = sys.stderr.isatty()
    shown = [-1]

    def report(done: int, total: int, what: str) -> None:
        pct = 100 * done // total
        if live:
            end = "\n" if done >= total else ""
            print(f"\r\x1b[K  suite: {done}/{total} runs ({pct}%) {what}", end=end, file=sys.stderr, flush=True)
        elif pct // 5 > shown[0]:
            shown[0] = pct // 5
            print(f"  suite: {done}/{total} runs ({pct}%) {what}", file=sys.stderr, flush=True)

    return report


def _reserve(args: argparse.Namespace) -> Reserve | None:
    from reconciler.placement import reserving

    if args.reserve_whole_host is None:
        return None
    try:
        return reserving.Reserve.parse(args.reserve_whole_host)
    except ValueError as e:
        raise UsageError(f"--reserve-whole-host {e}", code=reconciler_codes.SIMULATE_RESERVE) from None


def _wait(args: argparse.Namespace, reserve: Reserve | None) -> float | None:
    import math

    if args.wait_s is None:
        if reserve is not None and reserve.pending:
            raise UsageError(
                f"--reserve-whole-host {args.reserve_whole_host}: a pending reserve needs --wait-s "
                "(in the loss model nothing is ever pending)",
                code=reconciler_codes.SIMULATE_RESERVE,
            )
        return None
    try:
        wait = float(args.wait_s)
    except ValueError:
        wait = float("nan")
    if not (math.isfinite(wait) and wait >= 0):
        raise UsageError(
            f"--wait-s {args.wait_s!r}: expected a number of seconds >= 0, such as 3600",
            code=reconciler_codes.SIMULATE_WAIT,
        )
    return wait


def _whole_host_reserve(
    args: argparse.Namespace, reserve: Reserve | None, wait_s: float | None
) -> m.WholeHostReserve | None:
    """`--whole-host-reserve MAX_HOSTS[:AFTER_PENDING]` as the fleet setting, checked as the Fleet document is."""
    from pydantic import ValidationError

    from desired import models as m

    text = args.whole_host_reserve
    if text is None:
        return None
    if reserve is not None:
        raise UsageError(
            "--whole-host-reserve and --reserve-whole-host: run one reserve at a time",
            code=reconciler_codes.SIMULATE_RESERVE,
        )
    if wait_s is None:
        raise UsageError(
            f"--whole-host-reserve {text}: needs --wait-s (in the loss model nothing waits, so it holds nothing)",
            code=reconciler_codes.SIMULATE_RESERVE,
        )
    parts = text.split(":")
    try:
        if len(parts) not in (1, 2):
            raise ValueError("too many parts")
        numbers = [int(x) for x in parts]
        return m.WholeHostReserve(max_hosts=numbers[0], after_pending=numbers[1] if len(numbers) == 2 else 1)
    except (ValueError, ValidationError):
        raise UsageError(
            f"--whole-host-reserve {text!r}: expected MAX_HOSTS[:AFTER_PENDING], whole numbers, MAX_HOSTS >= 0 and "
            "AFTER_PENDING >= 1, such as 2 or 2:2",
            code=reconciler_codes.SIMULATE_RESERVE,
        ) from None


def run_suite(
    args: argparse.Namespace,
    reserve: Reserve | None = None,
    wait_s: float | None = None,
    whole: m.WholeHostReserve | None = None,
) -> int:
    from reconciler.placement import simulation, suite

    try:
        loads = [float(x) for x in args.loads.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(
            f"--loads {args.loads!r}: expected numbers such as 0.8,0.9,1.0", code=reconciler_codes.SIMULATE_SUITE_LOADS
        ) from e
    if not loads or any(not 0 < x <= 10 for x in loads):
        raise UsageError(
            f"--loads {args.loads!r}: loads must be in (0, 10]", code=reconciler_codes.SIMULATE_SUITE_LOADS
        )
    if args.seeds < 1 or args.requests < 1 or args.nodes < 1 or args.first_seed < 1:
        raise UsageError(
            "--seeds, --first-seed, --requests and --nodes must be at least 1",
            code=reconciler_codes.SIMULATE_SUITE_SIZE,
        )
    names = [x.strip() for x in args.families.split(",")] if args.families else [f.name for f in suite.FAMILIES]
    unknown = [n for n in names if n not in {f.name for f in suite.FAMILIES}]
    if unknown:
        raise UsageError(
            f"--families: unknown {', '.join(unknown)} (known: {', '.join(f.name for f in suite.FAMILIES)})",
            code=reconciler_codes.SIMULATE_SUITE_FAMILY,
        )
    families = [suite.family(n) for n in names]
    cells = suite.run(
        families,
        loads,
        seeds=args.seeds,
        requests=args.requests,
        nodes=args.nodes,
        first_seed=args.first_seed,
        progress=_suite_progress(args.quiet),
        lease_ends=simulation.LeaseEnds(args.lease_ends),
        reserve=reserve,
        wait_s=wait_s,
        whole_host_reserve=whole,
    )
    below = [c for c in cells if c.below]
    misses = suite.goal_misses(cells)
    if args.json:
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "seeds": args.seeds,
                    "first_seed": args.first_seed,
                    "requests": args.requests,
                    "loads": loads,
                    "lease_ends": args.lease_ends,
                    "reserve_whole_host": None if reserve is None else str(reserve),
                    **({} if whole is None else {"whole_host_reserve": whole.model_dump()}),
                    "wait_s": wait_s,
                    "families": [f.as_dict() for f in families],
                    "cells": [c.as_dict() for c in cells],
                    "default_below_a_baseline": len(below),
                    "goal_misses": misses,
                },
                indent=2,
            )
        )
    else:
        print(render_suite(cells, families, args))
    return 1 if below else 0


def render_suite(cells: list[Any], families: list[Any], args: argparse.Namespace) -> str:
    from policies import packing
    from reconciler.placement import suite

    policies = [p.value for p in packing.ALL]
    short = {
        "default": "default",
        "first-fit": "first-fit",
        "k8s-least-allocated": "k8s-least",
        "k8s-most-allocated": "k8s-most",
        "seed-rank": "seed-rank",
    }
    lines = [
        f"workload suite: {args.nodes} nodes, {args.seeds} seed(s) from {args.first_seed} x {args.requests} "
        "requests per family and load; acceptance_gpu summed over seeds; "
        "± se: standard error of the gap closed over the seeds' streams",
        "",
    ]
    if args.lease_ends != "terms":
        lines.insert(1, f"default told lease ends: {args.lease_ends} (the baselines never read them)")
    if args.reserve_whole_host is not None:
        lines.insert(1, f"default holds empty hosts back: --reserve-whole-host {args.reserve_whole_host} (research)")
    if args.whole_host_reserve is not None:
        lines.insert(
            1,
            f"default keeps empty hosts for whole-host requests: placement.whole_host_reserve "
            f"{args.whole_host_reserve} (the planner's rule)",
        )
    if args.wait_s is not None:
        lines.insert(
            1,
            f"wait and retry: refused requests wait up to {float(args.wait_s):g} s, retried oldest first "
            "(acceptance = GPUs placed within the wait; fluid = a fluid queue, not a bound)",
        )
    head = f"{'family':<18} {'load':>4} " + " ".join(f"{short.get(p, p):>10}" for p in policies)
    lines.append(head + f" {'fluid':>8} {'best base':>10} {'closed':>7} {'± se':>5}  note")
    by_name = {f.name: f for f in families}
    for c in cells:
        closed = c.closed
        fam = by_name[c.family]
        flag = "; ".join(
            x
            for x in (
                "held out" if fam.held_out else "",
                "BELOW " + ",".join(c.below) if c.below else "",
                c.wait_note(packing.Policy.DEFAULT.value),
            )
            if x
        )
        lines.append(
            f"{c.family:<18} {c.load:>4.2f} "
            + " ".join(f"{c.acceptance(p):>10.4f}" for p in policies)
            + f" {c.fluid_bound:>8.4f} {short.get(c.best_baseline, c.best_baseline):>10} "
            + (f"{closed:>7.0%}" if closed is not None else f"{'no gap':>7}")
            + (f" {se:>5.0%}" if (se := c.closed_se) is not None else f" {'-':>5}")
            + f"  {flag}"
        )
    worst = [c for c in cells if c.closed is not None and abs(c.load - 0.9) < 1e-9]
    lines.append("")
    if worst:
        w = min(worst, key=lambda c: c.closed if c.closed is not None else 1.0)
        se = w.closed_se
        spread = "" if se is None else f" ± {se:.0%} over {len(w.seeds)} streams"
        lines.append(f"worst family at load 0.9: {w.family} (closes {w.closed:.0%}{spread} of the best baseline's gap)")
    for c in cells:
        if c.held_out and abs(c.load - 0.9) < 1e-9:
            closed = c.closed
            lines.append(
                f"held out: {c.family} at load 0.9: "
                + (
                    "the best baseline reaches the fluid bound"
                    if closed is None
                    else f"closes {closed:.0%} of the best baseline's gap"
                )
                + (f", below {', '.join(c.below)}" if c.below else "")
            )
    misses = suite.goal_misses(cells)
    lines.append(
        "goal (never below a baseline; >= 25% of the gap closed at load 0.9): "
        + ("met" if not misses else "missed: " + "; ".join(misses))
    )
    return "\n".join(lines)
