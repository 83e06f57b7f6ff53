"""`gpuaas bench plan`: planner throughput and peak memory on synthetic fleets.

    gpuaas bench plan [--nodes 1000,10000,50000] [--json]

For each size: a synthetic fleet (`reconciler.placement.synthesis`), a quarter of
its nodes already holding claims (observed), and about one new allocation
per node in the fleet's request mix. It times `planner.plan()` end to end
(engine build included) and the placement phase alone, then runs it again
under tracemalloc for the peak Python memory of one plan.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import random
import sys
import time
import tracemalloc
from typing import TYPE_CHECKING, Any

from schemas.errors import UsageError

if TYPE_CHECKING:
    from desired.state import DesiredState
    from reconciler import plans

_EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_SIZES = ((1, 0.36), (2, 0.225), (4, 0.18), (8, 0.045))  # slice sizes; baremetal takes the rest (0.19)


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="planner throughput and peak memory at several fleet sizes")
    p.add_argument("--nodes", default="1000,10000,50000", help="comma-separated fleet sizes")
    p.add_argument("--allocations-per-node", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def scenario(nodes: int, *, per_node: float = 1.0, seed: int = 0) -> tuple[DesiredState, plans.Observed]:
    """A fleet with a quarter of its nodes busy and ~per_node new allocations per node."""
    from desired import models as m
    from reconciler import plans
    from reconciler.placement import synthesis
    from schemas import states

    desired = synthesis.desired_state(synthesis.fleet_documents(nodes, seed=seed))
    rnd = random.Random(seed)  # noqa: S311  # seeded, reproducible simulation input, not security
    claims: list[plans.ExistingClaim] = []
    placed = set()
    busy = rnd.sample(sorted(desired.nodes), nodes // 4)
    for i, name in enumerate(sorted(busy)):
        aid = f"old-{i:07d}"
        placed.add(aid)
        if i % 5 == 0:
            claims.append(
                plans.ExistingClaim(aid, name, states.ClaimKind.NODE_EXCLUSIVE, None, states.ClaimStatus.ACTIVE)
            )
        else:
            for s in range(4):  # one 4-GPU slice on NUMA group 0
                claims.append(plans.ExistingClaim(aid, name, states.ClaimKind.SLOT, s, states.ClaimStatus.ACTIVE))
    kinds = [(synthesis.H200_SLICE, g, w) for g, w in _SIZES] + [(synthesis.H200_BAREMETAL, 8, 0.19)]
    for i in range(int(nodes * per_node)):
        sku, g, _ = rnd.choices(kinds, [w for _, _, w in kinds])[0]
        aid = f"new-{i:07d}"
        desired.allocations[aid] = m.Allocation.model_construct(
            api_version="gpuaas.io/v1alpha1",
            kind="Allocation",
            id=aid,
            tenant=f"t{i % 50}",
            sku=sku,
            gpu_count=g,
            region=synthesis.REGION,
            image=None,
            ssh_keys=(),
            vm_profile=None,
            state=m.AllocationState.PRESENT,
            requested_at=_EPOCH + dt.timedelta(seconds=i),
        )
    return desired, plans.Observed(claims=tuple(claims), placed=frozenset(placed))


def measure(nodes: int, *, per_node: float = 1.0, seed: int = 0) -> dict[str, Any]:
    from reconciler.placement import placing, planner

    desired, observed = scenario(nodes, per_node=per_node, seed=seed)
    gc.collect()
    t0 = time.perf_counter()
    engine = placing.Engine(desired, observed)
    build_s = time.perf_counter() - t0
    del engine
    gc.collect()
    t0 = time.perf_counter()
    result = planner.plan(desired, observed)
    plan_s = time.perf_counter() - t0
    decisions = len(result.placements) + len(result.pending)
    place_s = max(plan_s - build_s, 1e-9)
    del result
    gc.collect()
    tracemalloc.start()
    planner.plan(desired, observed)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "nodes": nodes,
        "existing_claims": len(observed.claims),
        "allocations": decisions,
        "plan_seconds": round(plan_s, 3),
        "engine_build_seconds": round(build_s, 3),
        "decisions_per_second_end_to_end": round(decisions / plan_s, 1),
        "decisions_per_second_placing": round(decisions / place_s, 1),
        "peak_plan_mib": round(peak / 2**20, 1),
    }


def run(args: argparse.Namespace) -> int:
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError as e:
        raise UsageError(f"--nodes {args.nodes!r}: expected comma-separated integers") from e
    if not sizes or min(sizes) < 1:
        raise UsageError("--nodes needs positive sizes")
    rows = []
    for n in sizes:
        print(f"  bench plan: {n} nodes ...", file=sys.stderr, flush=True)
        rows.append(measure(n, per_node=args.allocations_per_node, seed=args.seed))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'nodes':>7} {'claims':>7} {'allocs':>7} {'plan_s':>8} {'build_s':>8} {'end2end/s':>10} "
        f"{'placing/s':>10} {'peak_MiB':>9}"
    )
    for r in rows:
        print(
            f"{r['nodes']:>7} {r['existing_claims']:>7} {r['allocations']:>7} {r['plan_seconds']:>8.2f} "
            f"{r['engine_build_seconds']:>8.2f} {r['decisions_per_second_end_to_end']:>10.0f} "
            f"{r['decisions_per_second_placing']:>10.0f} {r['peak_plan_mib']:>9.1f}"
        )
    return 0
