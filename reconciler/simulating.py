"""Replay a request stream through the real placement engine.

A request arrives, holds its GPUs for `duration_s`, then is released; a
request nothing can take is dropped, not queued. `duration_s` is also the
request's lease term (`Request.ends_at`, what `Allocation.lease_hours` tells
the planner): only `default` reads it; `lease_ends=False` replays the same
stream as on-demand leases without a known end. Next to the real run the
simulator keeps the fluid bound: the same stream when a request is accepted
whenever the pool's aggregate free GPUs cover it, as if GPUs could be moved
freely between hosts. The gap between the two is what fragmentation and
topology cost.

Pure apart from the wall clock used to time the engine (injectable).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from desired import models as m
from desired.loading import DesiredState
from policies import topology as t
from reconciler import placing, plans
from reconciler.synthesizing import Offer, WorkloadRow

Progress = Callable[[int, int], None]
TENANT = "simulated"


@dataclass(frozen=True, slots=True)
class Result:
    policy: str
    offered_requests: int
    accepted_requests: int
    offered_gpus: int
    accepted_gpus: int
    acceptance_gpu: float
    fluid_bound_gpu: float
    rejected_with_capacity: int
    mean_empty_nodes: float
    placements_per_second: float
    nodes: int
    pool_gpus: dict[str, int]
    engine_seconds: float
    acceptance_by_size: dict[str, float] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    lease_ends: bool = True  # requests carried their lease end (only `default` reads it)

    @property
    def gap(self) -> float:
        return self.fluid_bound_gpu - self.acceptance_gpu

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "offered_requests": self.offered_requests,
            "accepted_requests": self.accepted_requests, "offered_gpus": self.offered_gpus,
            "accepted_gpus": self.accepted_gpus, "acceptance_gpu": round(self.acceptance_gpu, 6),
            "fluid_bound_gpu": round(self.fluid_bound_gpu, 6), "gap_to_fluid": round(self.gap, 6),
            "rejected_with_capacity": self.rejected_with_capacity,
            "mean_empty_nodes": round(self.mean_empty_nodes, 3),
            "placements_per_second": round(self.placements_per_second, 1),
            "nodes": self.nodes, "pool_gpus": self.pool_gpus, "engine_seconds": round(self.engine_seconds, 3),
            "acceptance_by_size": {k: round(v, 6) for k, v in self.acceptance_by_size.items()},
            "rejections": self.rejections, "lease_ends": self.lease_ends,
        }


def pool_gpus(desired: DesiredState, observed: plans.Observed | None = None) -> dict[str, int]:
    """Sellable GPUs per accelerator model on active nodes (the fluid pools)."""
    engine = placing.Engine(desired, observed)
    out: Counter[str] = Counter()
    for f in engine.facts:
        if not f.active:
            continue
        sellable = [s for s in f.slots if s.sellable]
        if sellable:
            out[sellable[0].gpu_model] += len(sellable)
            continue
        sku = desired.skus.get(f.baremetal_sku or "")
        if sku is not None and sku.gpu_count:
            out[sku.accelerator_model] += sku.gpu_count
    return dict(out)


class _Tally:
    """What one replay counts, next to the engine."""

    def __init__(self, capacity: dict[str, int]) -> None:
        self.free = dict(capacity)
        self.fluid_free = dict(capacity)
        self.departures: list[tuple[float, int, str, str, int]] = []
        self.fluid_departures: list[tuple[float, int, str, int]] = []
        self.offered = self.accepted = self.offered_gpus = self.accepted_gpus = 0
        self.fluid_gpus = self.with_capacity = 0
        self.by_size_offered: Counter[str] = Counter()
        self.by_size_accepted: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()

    def fluid(self, now: float, i: int, pool: str, row: WorkloadRow) -> None:
        while self.fluid_departures and self.fluid_departures[0][0] <= now:
            _, _, fpool, g = heapq.heappop(self.fluid_departures)
            self.fluid_free[fpool] += g
        if self.fluid_free.get(pool, 0) >= row.gpus:
            self.fluid_free[pool] -= row.gpus
            self.fluid_gpus += row.gpus
            heapq.heappush(self.fluid_departures, (now + row.duration_s, i, pool, row.gpus))

    def outcome(self, i: int, aid: str, pool: str, row: WorkloadRow, out: placing.Placed | placing.Refused) -> None:
        self.offered += 1
        self.offered_gpus += row.gpus
        size = f"{row.sku}/{row.gpus}"
        self.by_size_offered[size] += 1
        if isinstance(out, placing.Placed):
            self.accepted += 1
            self.accepted_gpus += row.gpus
            self.by_size_accepted[size] += 1
            self.free[pool] -= row.gpus
            heapq.heappush(self.departures, (row.arrival_s + row.duration_s, i, aid, pool, row.gpus))
        else:
            self.rejections[out.code] += 1
            if self.free.get(pool, 0) >= row.gpus:
                self.with_capacity += 1


def simulate(desired: DesiredState, rows: Sequence[WorkloadRow], *, policy: str | None = None,
             progress: Progress | None = None, clock: Callable[[], float] = time.perf_counter,
             region: str | None = None, lease_ends: bool = True) -> Result:
    """Replay `rows` (sorted by arrival) against an empty fleet under `policy`.

    With `lease_ends`, each request carries its end (arrival + duration) as a
    reserved term would; without, every lease is on-demand (no known end).
    """
    engine = placing.Engine(desired, plans.Observed(), policy=policy)
    if region is None:
        regions = sorted({f.region for f in engine.facts})
        region = regions[0] if regions else ""
    capacity = pool_gpus(desired)
    pool_of = {name: sku.accelerator_model for name, sku in desired.skus.items()}
    tally = _Tally(capacity)
    departures = tally.departures
    empty_area = 0.0
    last_t = first_t = rows[0].arrival_s if rows else 0.0
    engine_s = 0.0
    step = max(1, len(rows) // 50)
    for i, row in enumerate(rows):
        now = row.arrival_s
        started = clock()
        while departures and departures[0][0] <= now:
            t_dep, _, gone, dpool, g = heapq.heappop(departures)
            empty_area += engine.empty_nodes * (t_dep - last_t)
            last_t = t_dep
            engine.release(gone)
            tally.free[dpool] += g
        empty_area += engine.empty_nodes * (now - last_t)
        last_t = now
        aid = f"r{i}"
        out = engine.place(placing.Request(aid, TENANT, row.sku, row.gpus, region, requested_at=now,
                                           ends_at=now + row.duration_s if lease_ends else None))
        engine_s += clock() - started
        pool = pool_of.get(row.sku, "")
        tally.fluid(now, i, pool, row)
        tally.outcome(i, aid, pool, row, out)
        if progress is not None and (i + 1) % step == 0:
            progress(i + 1, len(rows))
    horizon = last_t - first_t
    offered_gpus = tally.offered_gpus
    return Result(
        policy=engine.policy.value, offered_requests=tally.offered, accepted_requests=tally.accepted,
        offered_gpus=offered_gpus, accepted_gpus=tally.accepted_gpus,
        acceptance_gpu=tally.accepted_gpus / offered_gpus if offered_gpus else 1.0,
        fluid_bound_gpu=tally.fluid_gpus / offered_gpus if offered_gpus else 1.0,
        rejected_with_capacity=tally.with_capacity,
        mean_empty_nodes=empty_area / horizon if horizon > 0 else float(engine.empty_nodes),
        placements_per_second=tally.offered / engine_s if engine_s > 0 else 0.0,
        nodes=len(engine.nodes), pool_gpus=capacity, engine_seconds=engine_s,
        acceptance_by_size={k: tally.by_size_accepted[k] / n for k, n in sorted(tally.by_size_offered.items())},
        rejections=dict(sorted(tally.rejections.items())), lease_ends=lease_ends,
    )


def read_rows(lines: Iterable[dict[str, str]]) -> list[WorkloadRow]:
    """Rows from csv.DictReader records; raises ValueError naming the bad line."""
    out = []
    for n, rec in enumerate(lines, start=2):
        try:
            row = WorkloadRow(float(rec["arrival_s"]), float(rec["duration_s"]), rec["sku"].strip(),
                              int(rec["gpus"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"line {n}: {e}") from e
        if row.duration_s < 0 or row.gpus < 1:
            raise ValueError(f"line {n}: duration_s must be >= 0 and gpus >= 1")
        out.append(row)
    out.sort(key=lambda r: r.arrival_s)
    return out


def offers(desired: DesiredState, mix: dict[int, float]) -> list[Offer]:
    """One Offer per active slice SKU with the GPUs that can serve it, H200-style first.

    The size mix is restricted to the counts the SKU sells.
    """
    engine = placing.Engine(desired, plans.Observed())
    out = []
    for name in sorted(desired.skus):
        sku = desired.skus[name]
        if sku.capacity_shape is not m.CapacityShape.GPU_SLICE or not sku.active:
            continue
        gpus = sum(len(lay_positions) for lay_positions in _serving(engine, name))
        sizes = {g: w for g, w in mix.items() if g in sku.counts}
        if gpus and sizes:
            out.append(Offer(name, gpus, sizes))
    out.sort(key=lambda o: (-o.gpus, o.sku))
    return out


def _serving(engine: placing.Engine, sku: str) -> list[tuple[int, ...]]:
    return [t.positions(lay.full) for node in engine.nodes for part, _, lay in node.views
            if part in engine.slice_parts(sku)]
