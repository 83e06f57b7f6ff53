"""The watch loop's heap: the collector kept off the state in force, with its garbage bounded.

The loop holds millions of long-lived objects (documents by blob id, the
inventory's idents, the placement engine, the observed claims). A full
collection walks all of them: about 0.7 s at 5,000 nodes, seconds at
100,000. So after each applied revision (`Heap.settle`):

- the young generations (what this revision made; everything older is
  frozen) are collected: that frees the reference cycles the revision made
  and dropped, at the cost of what it made, not of the fleet;
- then `gc.freeze()` moves the survivors out of the collector's sight.

Measured on the gitops bench: after 49 allocation commits with a young
collection before each freeze, a full collection finds nothing more to
free. What a young collection cannot free are frozen objects that become
cyclic garbage later (a planner engine rebuilt cold, caches replaced after
a reconverge, blobs pruned from the cache). A full collection (unfreeze,
collect, freeze) reclaims them. It is due once the frozen heap has grown by
GROWTH since the last full one, so leftover garbage stays below that share
of the heap, and it runs only when the loop has been idle IDLE_S (`idle`),
never on the path of a commit. After a large build (a cold apply: millions
of young objects) the young collection would be a full walk: those objects
are frozen as they are (YOUNG_MAX), and the growth they bring makes a full
collection due at the next idle moment.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("gpuaas.loop")

GROWTH = 0.25  # a full collection is due once the frozen heap grew by this share since the last one
IDLE_S = 2.0  # ... and runs once no revision was applied for this long
YOUNG_MAX = 200_000  # more young objects than this (a cold apply): frozen without the young collection


class Heap:
    """When to collect what, for one loop (module docstring)."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, growth: float = GROWTH, idle_s: float = IDLE_S
    ) -> None:
        self.clock, self.growth, self.idle_s = clock, growth, idle_s
        self.baseline: int | None = None  # frozen objects after the last full collection (None: none yet)
        self.due = False
        self.settled_at = clock()
        self.young_collections = 0
        self.full_collections = 0
        self.last_full_s = 0.0
        self.last_freed = 0

    def settle(self) -> None:
        """After an applied revision: its own garbage collected, what lives on frozen."""
        young = gc.get_count()[0] <= YOUNG_MAX
        if young:
            self.young_collections += 1
            gc.collect()  # generations 0-2 only: the frozen (permanent) one is not walked
        gc.freeze()
        frozen = gc.get_freeze_count()
        if self.baseline is None:
            self.baseline = frozen
        # frozen uncollected (a cold build's garbage with it), or grown past the share: collect when idle
        if not young or frozen > self.baseline * (1 + self.growth):
            self.due = True
        self.settled_at = self.clock()

    def idle(self) -> bool:
        """Run a due full collection if the loop has been idle long enough; True when it ran."""
        if not self.due or self.clock() - self.settled_at < self.idle_s:
            return False
        t0 = time.perf_counter()
        gc.unfreeze()
        self.last_freed = gc.collect()
        gc.freeze()
        self.baseline = gc.get_freeze_count()
        self.due = False
        self.full_collections += 1
        self.last_full_s = time.perf_counter() - t0
        log.info(
            "full collection while idle: %d freed, %d kept, %.2fs", self.last_freed, self.baseline, self.last_full_s
        )
        return True
