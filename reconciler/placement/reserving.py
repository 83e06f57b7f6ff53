"""A simulator-only reserve of empty hosts for whole-host shapes (research, issue 31's fourth round).

In a burst, small slices that arrive first take the last empty hosts and the
whole-host requests behind them (baremetal, 8-GPU slices) are refused; no
choice of host gets that back (docs/placement.md, third round). A reserve
trades it back by refusing a small request that fits: while whole-host
requests have lately been refused, a request that is not whole-host and that
`default` would place by opening an empty host is refused instead, as long
as the pool's empty hosts are at most the reserve

    R = min(cap, whole-host requests refused in the last window_s - (after - 1))

so a workload with no whole-host refusals reserves nothing. The planner has
no such rule: the simulator drops a refused request, where the product keeps
it pending and retries it each revision, so this measures the trade only in
the loss model (`simulation`). Only `default` is gated; the baselines never are.

The second kind, `pending:CAP[:AFTER]`, is for the simulator's wait-and-retry
mode (`simulation.simulate(wait_s=...)`), where refused requests wait:

    R = min(cap, whole-host requests pending now - (after - 1))

which is what the product's planner could see (its pending requests), where
recent refusals are a stand-in the loss model needs. Without a wait it holds
nothing back (nothing is ever pending), so `simulate` refuses that pairing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from desired import models as m
from reconciler.placement import placing, reasons

RESERVED = "reserved_for_whole_host"  # the simulator's refusal code; not a planner reason (reasons.py)
WHOLE_HOST_GPUS = 8  # a slice of every GPU of an H200 or MI300X host
PENDING = "pending"  # the reserve kind driven by pending whole-host requests


class WholeHost:
    """Which requests take a whole host: a baremetal SKU's, or a slice of every GPU."""

    def __init__(self, skus: Mapping[str, m.Sku]) -> None:
        self.baremetal = frozenset(n for n, sku in skus.items() if sku.capacity_shape is m.CapacityShape.BAREMETAL)

    def __call__(self, sku: str, gpus: int) -> bool:
        return sku in self.baremetal or gpus >= WHOLE_HOST_GPUS


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
        return min(self.reserve.cap, max(0, signal - (self.reserve.after - 1)))

    def whole_refused(self, now: float) -> None:
        self.refused.append(now)

    def place(self, engine: placing.Engine, request: placing.Request, held: int) -> placing.Placed | placing.Refused:
        """`request` (not whole-host) placed, unless that opened one of the `held` empty hosts the reserve keeps."""
        empty = engine.empty_nodes
        out = engine.place(request)
        if held and empty <= held and isinstance(out, placing.Placed) and engine.empty_nodes < empty:
            engine.release(request.allocation_id)
            self.held += 1
            return reasons.Refused(RESERVED, f"held back: {empty} empty host(s), kept for refused whole-host demand")
        return out
