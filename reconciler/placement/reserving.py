"""Empty hosts kept for whole-host shapes: the planner's reserve, and the simulator's research variants.

In a burst, small slices that arrive first take the last empty hosts and the
whole-host requests behind them (baremetal, 8-GPU slices) are refused; no
choice of host gets that back (docs/placement.md, third round). A reserve
trades it back by holding a small request that fits: a request that is not
whole-host (`WholeHost`) and whose pick would open an empty host is held
while that host's pool has at most R empty hosts, so R stay empty for the
whole-host requests. "Empty host": no claim, and a whole-host request could
take it (active, every slot cleaned, none drifted: `Engine.empty_hosts`).
The request is never moved to a used host: the policy's pick is kept or
held. R is always `hosts_kept(cap, after, W)` = min(cap, W - (after - 1)),
never below 0, for a count W of whole-host demand:

- The planner's rule (`Holding`; `fleet.placement.whole_host_reserve`,
  policy `default` only; off when absent or `max_hosts: 0`). W counts, per
  pool, the whole-host requests of this planning pass not placed so far
  that the pool could serve (`Engine.pools`: it holds a node of their SKU
  and region their tenant may use): those before the request that were
  refused, and every one after it, not yet tried. The pass is oldest first,
  so counting only the refused older ones would hold nothing: a whole-host
  request is refused when its pool has no empty host, and a pass empties
  none. A whole-host request with no viable image (never placed) or of a
  shape the SKUs refuse counts nothing. A held request stays pending with
  `plan.sku_unavailable.reserved_for_whole_host` and is retried next
  revision. The simulator runs the same `Holding` in wait-and-retry mode
  when its fleet has the setting (`waiting`): there W is the queue's.
- Research, the simulator only (`Reserve`, `Gate`; `gpuaas simulate
  --reserve-whole-host`, `default` only). `WINDOW_S:CAP[:AFTER]`: W is the
  whole-host requests refused in the last window_s seconds (what the loss
  model, where nothing waits, can count). `pending:CAP[:AFTER]`, wait mode
  only: W is every whole-host request pending now, older or younger than
  the request. Both count the fleet as one pool (the synthetic fleets are).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from desired import models as m
from desired.state import DesiredState
from policies import packing
from reconciler.placement import placing, reasons

RESERVED = reasons.RESERVED  # the planner's reason code; the research gate refuses with it too
WHOLE_HOST_GPUS = 8  # a slice of every GPU of an H200 or MI300X host
PENDING = "pending"  # the reserve kind driven by pending whole-host requests


class WholeHost:
    """Which requests take a whole host: a baremetal SKU's, or a slice of every GPU."""

    def __init__(self, skus: Mapping[str, m.Sku]) -> None:
        self.baremetal = frozenset(n for n, sku in skus.items() if sku.capacity_shape is m.CapacityShape.BAREMETAL)

    def __call__(self, sku: str, gpus: int) -> bool:
        return sku in self.baremetal or gpus >= WHOLE_HOST_GPUS


def hosts_kept(cap: int, after: int, whole_waiting: int) -> int:
    """R: the empty hosts kept, min(cap, whole_waiting - (after - 1)), never below 0."""
    return min(cap, max(0, whole_waiting - (after - 1)))


def set_on_fleet(desired: DesiredState, setting: m.WholeHostReserve) -> None:
    """Give a (simulated) fleet `placement.whole_host_reserve`, in place: the state must be the caller's own."""
    fleet = desired.fleet
    if fleet is not None:
        placement = fleet.placement.model_copy(update={"whole_host_reserve": setting})
        desired.fleet = fleet.model_copy(update={"placement": placement})


class Holding:
    """The planner's reserve (`fleet.placement.whole_host_reserve`) on one engine.

    `waiting` is W per pool: the whole-host requests that wait now, each
    counted for every pool that could serve it. The caller keeps it (`wait`):
    the planner counts every whole-host request of the pass before placing
    any and uncounts each one as it is placed (or found to have no viable
    image); the simulator counts its queue's.
    """

    def __init__(self, engine: placing.Engine, setting: m.WholeHostReserve) -> None:
        self.engine = engine
        self.max_hosts, self.after = setting.max_hosts, setting.after_pending
        self.whole = WholeHost(engine.skus)
        self.waiting: Counter[placing.Pool] = Counter()
        self._pools: dict[tuple[str, str, str], frozenset[placing.Pool]] = {}  # (sku, region, tenant) -> pools
        self._version = engine.facts_version

    @classmethod
    def of(cls, engine: placing.Engine, fleet: m.Fleet | None) -> Holding | None:
        """The fleet's reserve on `engine`, or None where there is none (absent, 0, or not policy default)."""
        setting = fleet.placement.whole_host_reserve if fleet is not None else None
        if setting is None or setting.max_hosts == 0 or engine.policy is not packing.Policy.DEFAULT:
            return None
        return cls(engine, setting)

    @property
    def spec(self) -> str:
        """`MAX_HOSTS[:AFTER_PENDING]`, as `gpuaas simulate --whole-host-reserve` takes it."""
        return f"{self.max_hosts}" + (f":{self.after}" if self.after != 1 else "")

    def place(self, req: placing.Request, *, alternatives: int = 0) -> placing.Placed | placing.Refused:
        """`engine.place(req)`; a request that is not whole-host is held if it would open a host kept empty."""
        hold = None if self.whole(req.sku, req.gpu_count) else self._hold
        return self.engine.place(req, alternatives=alternatives, hold=hold)

    def wait(self, req: placing.Request, count: int = 1) -> None:
        """Count a whole-host request that waits (-1: no longer) for every pool that could serve it.

        Any other request, and one of a shape no fleet sells (the SKU or count refused), counts nothing.
        """
        if not self.whole(req.sku, req.gpu_count) or isinstance(
            self.engine.spec(req.sku, req.gpu_count, req.vm_profile), placing.Refused
        ):
            return
        for pool in self._candidates(req):
            self.waiting[pool] += count

    def kept(self, pool: placing.Pool) -> int:
        """R of one pool now."""
        return hosts_kept(self.max_hosts, self.after, self.waiting[pool])

    def _candidates(self, req: placing.Request) -> frozenset[placing.Pool]:
        if self._version != self.engine.facts_version:
            self._pools.clear()
            self._version = self.engine.facts_version
        key = (req.sku, req.region, req.tenant)
        pools = self._pools.get(key)
        if pools is None:
            pools = self._pools[key] = self.engine.pools(*key)
        return pools

    def _hold(self, pool: placing.Pool) -> placing.Refused | None:
        held = self.kept(pool)
        empty = self.engine.empty_hosts(pool)
        if empty > held:
            return None
        region, name = pool
        waiting = self.waiting[pool]
        return reasons.Refused(
            RESERVED,
            f"it fits only on an empty host, and pool {name} in {region} has {empty} empty host(s) left, no "
            f"more than the {held} kept for the {waiting} whole-host request(s) (baremetal or 8 GPUs) waiting "
            "for that pool (fleet.placement.whole_host_reserve); a smaller request opens an empty host there "
            f"only while more than {held} are empty",
            MappingProxyType(
                {
                    "region": region,
                    "pool": name,
                    "empty_hosts": empty,
                    "reserved_hosts": held,
                    "whole_host_waiting": waiting,
                    "max_hosts": self.max_hosts,
                    "after_pending": self.after,
                }
            ),
        )


@dataclass(frozen=True, slots=True)
class Reserve:
    window_s: float
    cap: int
    after: int = 1  # whole-host refusals in the window (or pending) before the first host is held back
    pending: bool = False  # R counts whole-host requests pending now (wait-and-retry mode), not recent refusals

    @classmethod
    def parse(cls, text: str) -> Reserve:
        """`WINDOW_S:CAP[:AFTER]` (e.g. `3600:2`) or `pending:CAP[:AFTER]`; ValueError says what is wrong."""
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(
                f"{text!r}: expected WINDOW_S:CAP[:AFTER] or pending:CAP[:AFTER], such as 3600:2 or pending:2"
            )
        pending = parts[0].strip() == PENDING
        try:
            window = 0.0 if pending else float(parts[0])
            cap, after = int(parts[1]), int(parts[2]) if len(parts) == 3 else 1
        except ValueError:
            raise ValueError(f"{text!r}: WINDOW_S is seconds (or 'pending'), CAP and AFTER whole numbers") from None
        if not (pending or window > 0) or cap < 1 or after < 1:
            raise ValueError(f"{text!r}: WINDOW_S must be above 0, CAP and AFTER at least 1")
        return cls(window, cap, after, pending)

    def __str__(self) -> str:
        head = PENDING if self.pending else f"{self.window_s:g}"
        return f"{head}:{self.cap}" + (f":{self.after}" if self.after != 1 else "")


class Gate:
    """One replay's reserve: the times whole-host requests were refused, and what it held back."""

    def __init__(self, reserve: Reserve) -> None:
        self.reserve = reserve
        self.refused: deque[float] = deque()
        self.held = 0  # requests refused for the reserve

    def hold(self, now: float, pending_whole: int = 0) -> int:
        """The reserve R at `now`: empty hosts a small request may not open.

        `pending_whole` (whole-host requests pending now) drives a `pending` reserve; the other kind ignores it.
        """
        if self.reserve.pending:
            signal = pending_whole
        else:
            while self.refused and self.refused[0] < now - self.reserve.window_s:
                self.refused.popleft()
            signal = len(self.refused)
        return hosts_kept(self.reserve.cap, self.reserve.after, signal)

    def whole_refused(self, now: float) -> None:
        self.refused.append(now)

    def place(self, engine: placing.Engine, request: placing.Request, held: int) -> placing.Placed | placing.Refused:
        """`request` (not whole-host) placed, unless it would open one of the `held` empty hosts the reserve keeps."""

        def hold(pool: placing.Pool) -> placing.Refused | None:
            empty = engine.empty_hosts(pool)
            if empty > held:
                return None
            return reasons.Refused(RESERVED, f"held back: {empty} empty host(s), kept for refused whole-host demand")

        out = engine.place(request, hold=hold if held else None)
        if isinstance(out, placing.Refused) and out.code == RESERVED:
            self.held += 1
        return out
