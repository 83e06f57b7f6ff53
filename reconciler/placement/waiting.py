"""The simulator's wait-and-retry mode (`simulation.simulate(wait_s=...)`; the rules are in `simulation`'s docstring).

The product keeps a request it cannot place pending and retries it each
revision, oldest first, until its deadline; the loss model drops it. This
replays that queue, with the fluid bound as a fluid queue beside it.

When the fleet keeps a reserve for whole-host requests
(`fleet.placement.whole_host_reserve`), `default` runs the planner's own
rule (`reserving.Holding`) with W the whole-host requests in the queue: one
counts from its first refusal until it is placed or expires, as in the
planner, where a pending whole-host request counts until placed. On the
synthetic fleets (one pool) that is the research `pending:CAP[:AFTER]`'s
count, and the figures are the same.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from desired.state import DesiredState
from policies import packing
from reconciler import plans
from reconciler.placement import placing
from reconciler.placement.reserving import RESERVED, Gate, Holding, Reserve, WholeHost
from reconciler.placement.simulation import TENANT, LeaseEnds, Progress, Result, _region, counted, lease_end, pool_gpus
from reconciler.placement.synthesis import WorkloadRow

RETRY_SHORTCUTS = True  # the exact shortcuts of `simulation`'s docstring; False retries naively (tests)


@dataclass(slots=True)
class _Pending:
    i: int
    row: WorkloadRow
    pool: str
    whole: bool


class _FluidQueue:
    """The fluid bound with a queue: each pool's aggregate free GPUs, oldest first, the same deadline."""

    def __init__(self, capacity: dict[str, int], wait_s: float) -> None:
        self.free = dict(capacity)
        self.wait_s = wait_s
        self.departures: list[tuple[float, int, str, int]] = []
        self.queue: OrderedDict[int, tuple[str, WorkloadRow]] = OrderedDict()
        self.gpus = 0

    def _try(self, now: float, i: int, pool: str, row: WorkloadRow) -> bool:
        if self.free.get(pool, 0) < row.gpus:
            return False
        self.free[pool] -= row.gpus
        self.gpus += row.gpus
        heapq.heappush(self.departures, (now + row.departure_s - row.arrival_s, i, pool, row.gpus))
        return True

    def _expire(self, now: float) -> None:
        q = self.queue
        while q:
            _, row = q[next(iter(q))]
            if now - row.arrival_s < self.wait_s:
                break
            q.popitem(last=False)

    def _pass(self, now: float) -> None:
        self._expire(now)
        for i, (pool, row) in list(self.queue.items()):
            if self._try(now, i, pool, row):
                del self.queue[i]

    def advance(self, now: float) -> None:
        """Departures up to `now`, each instant followed by a pass over the queue; then expiry at `now`."""
        deps = self.departures
        while deps and deps[0][0] <= now:
            t_dep = deps[0][0]
            while deps and deps[0][0] == t_dep:
                _, _, pool, g = heapq.heappop(deps)
                self.free[pool] += g
            if self.queue:
                self._pass(t_dep)
        self._expire(now)

    def arrive(self, i: int, pool: str, row: WorkloadRow) -> None:
        now = row.arrival_s
        self.advance(now)  # nothing freed since the last pass: the queue cannot fit more than it did
        if not self._try(now, i, pool, row):
            self.queue[i] = (pool, row)

    def drain(self) -> None:
        while self.queue and self.departures:
            self.advance(self.departures[0][0])


class Waiting:
    """One replay in wait-and-retry mode (`simulate(wait_s=...)`, the module's docstring)."""

    def __init__(
        self,
        desired: DesiredState,
        rows: Sequence[WorkloadRow],
        *,
        policy: str | None,
        clock: Callable[[], float],
        region: str | None,
        lease: LeaseEnds,
        reserve: Reserve | None,
        wait: float | None,
    ) -> None:
        wait_s = wait
        if wait_s is None:
            raise ValueError("a pending reserve needs wait_s: in the loss model nothing is ever pending")
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise ValueError(f"wait_s must be a finite number of seconds >= 0, not {wait_s!r}")
        self.rows = rows
        self.engine = placing.Engine(desired, plans.Observed(), policy=policy)
        self.region = _region(self.engine, region)
        self.clock = clock
        self.lease_ends = lease
        self.wait_s = wait_s
        self.capacity = pool_gpus(desired)
        self.free = dict(self.capacity)
        self.pool_of = {name: sku.accelerator_model for name, sku in desired.skus.items()}
        self.whole = WholeHost(desired.skus)
        default = self.engine.policy is packing.Policy.DEFAULT
        self.gate = Gate(reserve) if reserve is not None and default else None
        self.holding = Holding.of(self.engine, desired.fleet)  # the planner's reserve (default only)
        if self.holding is not None and reserve is not None:
            raise ValueError("a research reserve and the fleet's whole_host_reserve: run one at a time")
        self.whole_gone = False  # a whole-host request left the queue since the last pass began (R may have fallen)
        self.holding_any = False  # the planner's reserve held a request since the last pass began
        self.fluid = _FluidQueue(self.capacity, wait_s)
        self.departures: list[tuple[float, int, str, str, int]] = []  # (leaves at, i, allocation id, pool, gpus)
        self.queue: OrderedDict[int, _Pending] = OrderedDict()  # request order: oldest first
        self.pending_whole = 0
        self.gated_hold = 0  # the largest R the reserve refused with since the last pass began
        self.gated: set[int] = set()
        self.offered = self.offered_gpus = self.accepted = self.accepted_gpus = 0
        self.with_capacity = self.expired = self.told = 0
        self.by_size_offered: Counter[str] = Counter()
        self.by_size_accepted: Counter[str] = Counter()
        self.rejections: Counter[str] = Counter()
        self.waits: list[float] = []
        self.gpu_seconds = 0.0
        self.engine_s = self.empty_area = 0.0
        self.last_t = self.first_t = rows[0].arrival_s if rows else 0.0
        self.draining = False

    def hold(self, now: float) -> int:
        return 0 if self.gate is None else self.gate.hold(now, self.pending_whole)

    def _try(self, now: float, p: _Pending) -> placing.Placed | placing.Refused:
        row = p.row if now == p.row.arrival_s else replace(p.row, arrival_s=now)  # it holds duration_s from now
        aid = f"r{p.i}"
        # A request placed late keeps the portal's requested_at, as the product's allocation does (placement
        # ranks a host by its oldest request: `packing.node_key`), and a lease term counted from it
        # (`requests.lease_end`); only the true departure, the EXACT oracle's end, moves with the placement.
        ends = lease_end(row if self.lease_ends is LeaseEnds.EXACT else p.row, self.lease_ends)
        request = placing.Request(
            aid, TENANT, row.sku, row.gpus, self.region, requested_at=p.row.arrival_s, ends_at=ends
        )
        engine, gate = self.engine, self.gate
        started = self.clock()
        if self.holding is not None:
            out = self.holding.place(request)
            if isinstance(out, placing.Refused) and out.code == RESERVED:
                self.holding_any = True
                self.gated.add(p.i)
            elif isinstance(out, placing.Placed) and p.whole and p.i in self.queue:
                self.holding.wait(request, -1)
                self.whole_gone = True
        elif gate is None or p.whole:
            out = engine.place(request)
        else:
            held = self.hold(now)
            out = gate.place(engine, request, held)
            if isinstance(out, placing.Refused) and out.code == RESERVED:
                self.gated_hold = max(self.gated_hold, held)
                self.gated.add(p.i)
        self.engine_s += self.clock() - started
        if isinstance(out, placing.Placed):
            self.accepted += 1
            self.accepted_gpus += row.gpus
            self.by_size_accepted[f"{row.sku}/{row.gpus}"] += 1
            self.free[p.pool] -= row.gpus
            heapq.heappush(self.departures, (row.departure_s, p.i, aid, p.pool, row.gpus))
            self.waits.append(now - p.row.arrival_s)
            self.gpu_seconds += row.gpus * (row.departure_s - now)
        return out

    def _expire(self, now: float) -> None:
        q = self.queue
        while q:
            p = q[next(iter(q))]
            if now - p.row.arrival_s < self.wait_s:
                break
            q.popitem(last=False)
            self.expired += 1
            self.pending_whole -= p.whole
            if p.whole and self.holding is not None:
                self.holding.wait(self._request(p), -1)
                self.whole_gone = True

    def _request(self, p: _Pending) -> placing.Request:
        """The request `p` stands for, as far as the reserve's count reads it (SKU, region, tenant)."""
        return placing.Request(f"r{p.i}", TENANT, p.row.sku, p.row.gpus, self.region)

    def _pass(self, now: float) -> None:
        """Retry every pending request, oldest first (the planner's revision)."""
        self._expire(now)
        self.gated_hold = 0
        self.whole_gone = self.holding_any = False
        refused: set[tuple[str, int]] = set()  # shapes the engine refused in this pass: refused still
        for i, p in list(self.queue.items()):
            if RETRY_SHORTCUTS and (self.free.get(p.pool, 0) < p.row.gpus or (p.row.sku, p.row.gpus) in refused):
                continue
            out = self._try(now, p)
            if isinstance(out, placing.Placed):
                del self.queue[i]
                self.pending_whole -= p.whole
            elif out.code != RESERVED:
                refused.add((p.row.sku, p.row.gpus))

    def _advance(self, now: float) -> None:
        """Departures up to `now`; after each instant's releases the queue is retried."""
        deps = self.departures
        while deps and deps[0][0] <= now:
            t_dep = deps[0][0]
            if not self.draining:
                self.empty_area += self.engine.empty_nodes * (t_dep - self.last_t)
                self.last_t = t_dep
            while deps and deps[0][0] == t_dep:
                _, _, gone, dpool, g = heapq.heappop(deps)
                self.engine.release(gone)
                self.free[dpool] += g
            if self.queue:
                self._pass(t_dep)
        self._expire(now)

    def arrive(self, i: int, row: WorkloadRow) -> None:
        now = row.arrival_s
        self._advance(now)
        self.empty_area += self.engine.empty_nodes * (now - self.last_t)
        self.last_t = now
        if self.queue and (
            not RETRY_SHORTCUTS or self.hold(now) < self.gated_hold or (self.whole_gone and self.holding_any)
        ):
            self._pass(now)
        pool = self.pool_of.get(row.sku, "")
        whole = self.whole(row.sku, row.gpus)
        self.offered += 1
        self.offered_gpus += row.gpus
        self.by_size_offered[f"{row.sku}/{row.gpus}"] += 1
        self.told += lease_end(row, self.lease_ends) is not None
        pending = _Pending(i, row, pool, whole)
        out = self._try(now, pending)
        if isinstance(out, placing.Refused):
            self.rejections[out.code] += 1
            if self.free.get(pool, 0) >= row.gpus:
                self.with_capacity += 1
            self.queue[i] = pending
            self.pending_whole += whole
            if whole and self.holding is not None:
                self.holding.wait(self._request(pending))
            if whole and self.gate is not None and not self.gate.reserve.pending:
                self.gate.whole_refused(now)
        self.fluid.arrive(i, pool, row)

    def run(self, progress: Progress | None, repack_bound_gpu: float | None) -> Result:
        rows = self.rows
        step = max(1, len(rows) // 50)
        for i, row in enumerate(rows):
            self.arrive(i, row)
            if progress is not None and (i + 1) % step == 0:
                progress(i + 1, len(rows))
        horizon = self.last_t - self.first_t
        self.draining = True
        while self.queue and self.departures:  # every request ends placed or expired
            self._advance(self.departures[0][0])
        self.expired += len(self.queue)  # nothing is running: the fleet empty could not take them
        self.fluid.drain()
        waits = sorted(self.waits)
        return counted(
            self.engine,
            self,
            fluid_gpus=self.fluid.gpus,
            empty_area=self.empty_area,
            horizon=horizon,
            engine_s=self.engine_s,
            capacity=self.capacity,
            told=self.told,
            lease_ends=self.lease_ends,
            repack_bound_gpu=repack_bound_gpu,
            reserve=None if self.gate is None else str(self.gate.reserve),
            whole_host_reserve=None if self.holding is None else self.holding.spec,
            held_for_reserve=len(self.gated),
            wait_s=self.wait_s,
            expired_requests=self.expired,
            mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
            p95_wait_s=waits[max(0, math.ceil(0.95 * len(waits)) - 1)] if waits else 0.0,
            waited_requests=sum(1 for w in waits if w > 0),
            gpu_seconds=self.gpu_seconds,
        )
