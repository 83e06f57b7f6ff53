"""Replay a request stream through the real placement engine.

A request arrives, holds its GPUs until it leaves, then is released; a
request nothing can take is dropped, not queued. A row's `duration_s` is how
long the allocation is used; `lease_s`, when the row has one, is the term
the portal sent with it (`Allocation.lease_hours`): an upper bound, so the
allocation leaves at `duration_s` or at `lease_s`, whichever comes first.
What the planner is told about lease ends (`LeaseEnds`):

- `terms` (the default): a request carries `lease_s` as its lease end when
  the row has one, and is an on-demand lease (no known end) when it has none;
- `none`: every request is on demand, whatever the rows say;
- `exact`: every request carries its real departure as its lease end. An
  oracle no planner has, kept to measure what perfect knowledge would be
  worth; never the default.

Only `default` reads lease ends; the baselines never do.

Next to the real run the simulator keeps two bounds. The fluid bound: the
same stream when a request is accepted whenever the pool's aggregate free
GPUs cover it, as if GPUs could be moved freely between hosts. The repack
bound (`repack_bound`): a request is accepted when the running allocations
plus it fit the real hosts, topology rules included, once every allocation
may move (first-fit decreasing of all of them at each arrival). The gap from
a policy to the repack bound is what placement without migration costs; the
gap between the two bounds is what topology costs even with migration.

Wait and retry (`simulate(wait_s=...)`). By default the replay is a loss
model, as above. With `wait_s`, it is the product's queue instead: a request
the engine refuses stays pending, and at every later event (each arrival and
each departure instant) the pending requests are retried oldest first, the
way the planner retries pending requests each revision in request order
until `pending_deadline_seconds`. A request placed late holds its GPUs for
its own `duration_s` (cut at its `lease_s`) from the moment it is placed; a
request pending `wait_s` or longer is dropped (expired), as the deadline
fails it (`policies.deadlines.overdue`). After the last arrival the replay
goes on through departures until the queue is empty, so every request ends
placed or expired. `wait_s=0` is the loss model. The fluid bound becomes a
fluid queue: the same order and deadline against each pool's aggregate free
GPUs. Shortcuts (each exact; `waiting.RETRY_SHORTCUTS = False` turns them off, and
a test checks the figures are the same): the queue is retried only when
something could have changed since its last pass: at each departure instant
(after its releases), and at an arrival only when the reserve's R went down
(a placement only takes capacity, so a request refused since is refused
still); in a pass, a request its
pool's aggregate free GPUs cannot cover is skipped without an engine call,
and so is a (sku, gpus) the engine already refused in that pass. With a
reserve, the signal of `pending:CAP` is the whole-host requests pending at
the time; a `WINDOW_S:CAP` reserve counts a whole-host request's first
refusal only (at its arrival), not its retries. When the fleet has
`placement.whole_host_reserve`, `default` runs the planner's reserve
(`reserving.Holding`, `waiting`); in the loss model nothing waits, so it
would hold nothing, and the loss model leaves it out.

Pure apart from the wall clock used to time the engine (injectable).
"""

from __future__ import annotations

import enum
import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from desired import models as m
from desired.state import DesiredState
from policies import packing
from policies import topology as t
from reconciler import plans
from reconciler.placement import placing
from reconciler.placement.reserving import Gate, Reserve, WholeHost
from reconciler.placement.synthesis import Offer, WorkloadRow

Progress = Callable[[int, int], None]
TENANT = "simulated"


class LeaseEnds(enum.StrEnum):
    """What the planner is told about when each lease ends."""

    TERMS = "terms"  # the row's lease_s, when it has one (the portal's term)
    NONE = "none"  # nothing: every lease on demand
    EXACT = "exact"  # the real departure: an oracle, for research only


def lease_end(row: WorkloadRow, lease_ends: LeaseEnds) -> float | None:
    """The lease end a request carries to the planner under `lease_ends`."""
    if lease_ends is LeaseEnds.EXACT:
        return row.departure_s
    if lease_ends is LeaseEnds.TERMS and row.lease_s is not None:
        return row.arrival_s + row.lease_s
    return None


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
    lease_ends: bool = True  # some requests carried a lease end (only `default` reads them)
    lease_mode: str = LeaseEnds.TERMS.value
    repack_bound_gpu: float | None = None  # computed once per workload (`repack_bound`), when asked
    reserve: str | None = None  # the reserve `default` ran with (`reserving.Reserve`), research only
    held_for_reserve: int = 0  # small requests it refused to keep empty hosts
    # the fleet's whole_host_reserve `default` ran with (`reserving.Holding.spec`; wait mode), None: none
    whole_host_reserve: str | None = None
    wait_s: float | None = None  # wait-and-retry mode: how long a refused request waits (None: the loss model)
    expired_requests: int = 0  # wait mode: requests dropped after waiting wait_s
    mean_wait_s: float = 0.0  # mean wait of the placed requests, seconds (0 in the loss model)
    p95_wait_s: float = 0.0  # 95th percentile of the same
    waited_requests: int = 0  # placed requests that waited at all
    gpu_seconds: float = 0.0  # wait mode: GPU-seconds the placed requests held

    @property
    def gap(self) -> float:
        return self.fluid_bound_gpu - self.acceptance_gpu

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "offered_requests": self.offered_requests,
            "accepted_requests": self.accepted_requests,
            "offered_gpus": self.offered_gpus,
            "accepted_gpus": self.accepted_gpus,
            "acceptance_gpu": round(self.acceptance_gpu, 6),
            "fluid_bound_gpu": round(self.fluid_bound_gpu, 6),
            "gap_to_fluid": round(self.gap, 6),
            "rejected_with_capacity": self.rejected_with_capacity,
            "mean_empty_nodes": round(self.mean_empty_nodes, 3),
            "placements_per_second": round(self.placements_per_second, 1),
            "nodes": self.nodes,
            "pool_gpus": self.pool_gpus,
            "engine_seconds": round(self.engine_seconds, 3),
            "acceptance_by_size": {k: round(v, 6) for k, v in self.acceptance_by_size.items()},
            "rejections": self.rejections,
            "lease_ends": self.lease_ends,
            "lease_mode": self.lease_mode,
            "repack_bound_gpu": None if self.repack_bound_gpu is None else round(self.repack_bound_gpu, 6),
            "gap_to_repack": None
            if self.repack_bound_gpu is None
            else round(self.repack_bound_gpu - self.acceptance_gpu, 6),
            "reserve": self.reserve,
            **({} if self.whole_host_reserve is None else {"whole_host_reserve": self.whole_host_reserve}),
            "held_for_reserve": self.held_for_reserve,
            **(
                {}
                if self.wait_s is None
                else {
                    "wait_s": self.wait_s,
                    "expired_requests": self.expired_requests,
                    "waited_requests": self.waited_requests,
                    "mean_wait_s": round(self.mean_wait_s, 3),
                    "p95_wait_s": round(self.p95_wait_s, 3),
                    "gpu_seconds": round(self.gpu_seconds, 3),
                }
            ),
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


class Counts(Protocol):
    """What a replay counts of its requests (`_Tally`, `waiting.Waiting`)."""

    offered: int
    accepted: int
    offered_gpus: int
    accepted_gpus: int
    with_capacity: int
    by_size_offered: Counter[str]
    by_size_accepted: Counter[str]
    rejections: Counter[str]


def counted(
    engine: placing.Engine,
    counts: Counts,
    *,
    fluid_gpus: int,
    empty_area: float,
    horizon: float,
    engine_s: float,
    capacity: dict[str, int],
    told: int,
    lease_ends: LeaseEnds,
    repack_bound_gpu: float | None,
    **mode: Any,
) -> Result:
    """A replay's counts as its Result, every share worked out here (the loss and the wait replays);
    `mode`: the fields only one of them sets (the reserve's, the wait's)."""
    offered_gpus = counts.offered_gpus
    return Result(
        policy=engine.policy.value,
        offered_requests=counts.offered,
        accepted_requests=counts.accepted,
        offered_gpus=offered_gpus,
        accepted_gpus=counts.accepted_gpus,
        acceptance_gpu=counts.accepted_gpus / offered_gpus if offered_gpus else 1.0,
        fluid_bound_gpu=fluid_gpus / offered_gpus if offered_gpus else 1.0,
        rejected_with_capacity=counts.with_capacity,
        mean_empty_nodes=empty_area / horizon if horizon > 0 else float(engine.empty_nodes),
        placements_per_second=counts.offered / engine_s if engine_s > 0 else 0.0,
        nodes=len(engine.nodes),
        pool_gpus=capacity,
        engine_seconds=engine_s,
        acceptance_by_size={k: counts.by_size_accepted[k] / n for k, n in sorted(counts.by_size_offered.items())},
        rejections=dict(sorted(counts.rejections.items())),
        lease_ends=told > 0,
        lease_mode=lease_ends.value,
        repack_bound_gpu=repack_bound_gpu,
        **mode,
    )


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
            heapq.heappush(self.fluid_departures, (row.departure_s, i, pool, row.gpus))

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
            heapq.heappush(self.departures, (row.departure_s, i, aid, pool, row.gpus))
        else:
            self.rejections[out.code] += 1
            if self.free.get(pool, 0) >= row.gpus:
                self.with_capacity += 1


def _region(engine: placing.Engine, region: str | None) -> str:
    if region is not None:
        return region
    regions = sorted({f.region for f in engine.facts})
    return regions[0] if regions else ""


def _wait(
    desired: DesiredState,
    rows: Sequence[WorkloadRow],
    progress: Progress | None,
    repack_bound_gpu: float | None,
    **how: Any,
) -> Result:
    """`simulate` in wait-and-retry mode (`waiting`, imported here: it builds on this module's types)."""
    from reconciler.placement import waiting

    return waiting.Waiting(desired, rows, **how).run(progress, repack_bound_gpu)


def simulate(
    desired: DesiredState,
    rows: Sequence[WorkloadRow],
    *,
    policy: str | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.perf_counter,
    region: str | None = None,
    lease_ends: LeaseEnds = LeaseEnds.TERMS,
    repack_bound_gpu: float | None = None,
    reserve: Reserve | None = None,
    wait_s: float | None = None,
) -> Result:
    """Replay `rows` (sorted by arrival) against an empty fleet under `policy`.

    `lease_ends` says what each request tells the planner about its end (see
    `LeaseEnds`); departures are the rows' own (`WorkloadRow.departure_s`)
    whatever the planner is told.
    `repack_bound_gpu` (from `repack_bound`, the same for every policy) is
    carried into the result. `reserve` holds empty hosts back from small
    requests under `default` only (`reserving`, research). `wait_s` turns
    the loss model into wait and retry (the module's docstring); None keeps
    the loss model.
    """
    lease_ends = LeaseEnds(lease_ends)
    if wait_s is not None or (reserve is not None and reserve.pending):
        return _wait(
            desired,
            rows,
            progress,
            repack_bound_gpu,
            policy=policy,
            clock=clock,
            region=region,
            lease=lease_ends,
            reserve=reserve,
            wait=wait_s,
        )
    engine = placing.Engine(desired, plans.Observed(), policy=policy)
    region = _region(engine, region)
    capacity = pool_gpus(desired)
    pool_of = {name: sku.accelerator_model for name, sku in desired.skus.items()}
    tally = _Tally(capacity)
    departures = tally.departures
    empty_area = 0.0
    last_t = first_t = rows[0].arrival_s if rows else 0.0
    engine_s = 0.0
    step = max(1, len(rows) // 50)
    told = 0  # requests that carried a lease end
    gate = Gate(reserve) if reserve is not None and engine.policy is packing.Policy.DEFAULT else None
    whole = WholeHost(desired.skus)
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
        end = lease_end(row, lease_ends)
        told += end is not None
        request = placing.Request(aid, TENANT, row.sku, row.gpus, region, requested_at=now, ends_at=end)
        if gate is None:
            out = engine.place(request)
        elif whole(row.sku, row.gpus):
            out = engine.place(request)
            if not isinstance(out, placing.Placed):
                gate.whole_refused(now)
        else:
            out = gate.place(engine, request, gate.hold(now))
        engine_s += clock() - started
        pool = pool_of.get(row.sku, "")
        tally.fluid(now, i, pool, row)
        tally.outcome(i, aid, pool, row, out)
        if progress is not None and (i + 1) % step == 0:
            progress(i + 1, len(rows))
    return counted(
        engine,
        tally,
        fluid_gpus=tally.fluid_gpus,
        empty_area=empty_area,
        horizon=last_t - first_t,
        engine_s=engine_s,
        capacity=capacity,
        told=told,
        lease_ends=lease_ends,
        repack_bound_gpu=repack_bound_gpu,
        reserve=None if gate is None else str(gate.reserve),
        held_for_reserve=0 if gate is None else gate.held,
    )


class _Repacker:
    """Whether a set of allocations fits the fleet when every one of them may move.

    `live` holds a packing of the running allocations (a witness that they
    fit). A request that fits beside them, first fit, is accepted as is;
    otherwise every running allocation and the request are packed again from
    scratch into `spare`, first-fit decreasing (whole hosts first, then by
    size), and `spare` becomes the packing when all fit. Both are the real
    engine under `first-fit`, so the topology rules are the planner's. A
    request its pool's aggregate free GPUs cannot cover is refused without
    a repack (no packing can hold it).
    """

    def __init__(self, desired: DesiredState, region: str | None) -> None:
        first_fit = packing.Policy.FIRST_FIT.value
        self.live = placing.Engine(desired, plans.Observed(), policy=first_fit)
        self.spare = placing.Engine(desired, plans.Observed(), policy=first_fit)
        self.region = _region(self.live, region)
        self.whole = WholeHost(desired.skus).baremetal
        self.running: dict[str, tuple[str, int]] = {}  # allocation id -> (sku, gpus), in arrival order
        self.pool_of = {name: sku.accelerator_model for name, sku in desired.skus.items()}
        self.free = pool_gpus(desired)
        self.repacks = 0

    def _request(self, aid: str, sku: str, gpus: int) -> placing.Request:
        return placing.Request(aid, TENANT, sku, gpus, self.region)

    def arrive(self, aid: str, sku: str, gpus: int) -> bool:
        pool = self.pool_of.get(sku, "")
        if isinstance(self.live.place(self._request(aid, sku, gpus)), placing.Placed):
            self._take(aid, sku, gpus)
            return True
        if isinstance(self.live.spec(sku, gpus), placing.Refused) or self.free.get(pool, 0) < gpus:
            return False  # no host could ever take it / no packing could
        spare = self.spare
        for held in list(spare.where):
            spare.release(held)
        items = [*self.running.items(), (aid, (sku, gpus))]
        items.sort(key=lambda kv: (-kv[1][1], kv[1][0] not in self.whole))  # stable: arrival order last
        self.repacks += 1
        for held, (hsku, hgpus) in items:
            if not isinstance(spare.place(self._request(held, hsku, hgpus)), placing.Placed):
                return False
        self.live, self.spare = spare, self.live
        self._take(aid, sku, gpus)
        return True

    def _take(self, aid: str, sku: str, gpus: int) -> None:
        self.running[aid] = (sku, gpus)
        pool = self.pool_of.get(sku, "")
        self.free[pool] = self.free.get(pool, 0) - gpus

    def leave(self, aid: str) -> None:
        held = self.running.pop(aid, None)
        if held is not None:
            self.live.release(aid)
            pool = self.pool_of.get(held[0], "")
            self.free[pool] = self.free.get(pool, 0) + held[1]


def repack_bound(
    desired: DesiredState, rows: Sequence[WorkloadRow], *, region: str | None = None, progress: Progress | None = None
) -> float:
    """Accepted GPUs / offered GPUs when every running allocation may move at each arrival.

    Departures are the rows' own (`WorkloadRow.departure_s`). A request is
    accepted iff the running allocations plus it fit the fleet's hosts under
    the topology rules after first-fit decreasing of all of them; a refused
    request is dropped. An upper bound for any policy that never migrates,
    up to the first-fit-decreasing heuristic (exact when sizes divide each
    other, as 1, 2, 4, 8 on 8-GPU hosts do).
    """
    packer = _Repacker(desired, region)
    departures: list[tuple[float, int, str]] = []
    offered = accepted = 0
    step = max(1, len(rows) // 50)
    for i, row in enumerate(rows):
        while departures and departures[0][0] <= row.arrival_s:
            packer.leave(heapq.heappop(departures)[2])
        aid = f"r{i}"
        offered += row.gpus
        if packer.arrive(aid, row.sku, row.gpus):
            accepted += row.gpus
            heapq.heappush(departures, (row.departure_s, i, aid))
        if progress is not None and (i + 1) % step == 0:
            progress(i + 1, len(rows))
    return accepted / offered if offered else 1.0


def read_rows(lines: Iterable[dict[str, str]]) -> list[WorkloadRow]:
    """Rows from csv.DictReader records; raises ValueError naming the bad line.

    `lease_s` is optional, per file and per row: missing or empty is an on-demand lease.
    """
    out = []
    for n, rec in enumerate(lines, start=2):
        try:
            lease = (rec.get("lease_s") or "").strip()
            row = WorkloadRow(
                float(rec["arrival_s"]),
                float(rec["duration_s"]),
                rec["sku"].strip(),
                int(rec["gpus"]),
                float(lease) if lease else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"line {n}: {e}") from e
        if row.duration_s < 0 or row.gpus < 1:
            raise ValueError(f"line {n}: duration_s must be >= 0 and gpus >= 1")
        if row.lease_s is not None and not 0 < row.lease_s < float("inf"):
            raise ValueError(f"line {n}: lease_s must be a positive number of seconds (or empty: on demand)")
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
    return [t.positions(lay.full) for lay in engine.serving_layouts(sku)]
