"""The watch loop's heap: the collector kept off the state in force, with its garbage bounded.

The loop holds millions of long-lived objects (documents by blob id, the
inventory's idents, the placement engine, the observed claims). A full
collection walks all of them: about 0.9 s at 10,000 nodes, seconds at
100,000. So after each revision applied (`Heap.settle`):

- a revision read by delta (a commit's few files): every YOUNG_EVERY such
  revisions the young generations (what they made; everything older is
  frozen) are collected, which frees the reference cycles they made and
  dropped at the cost of what they made, not of the fleet; then
  `gc.freeze()` moves the survivors out of the collector's sight;
- a revision read whole (the first, a cold build of millions of objects):
  frozen as it is (collecting it would be the full walk), and a full
  collection is due.

Measured in-process on the gitops bench fleet: after 49 allocation commits
settled so, a full collection finds nothing more to free (with a freeze
alone, about 130 objects a commit waited for it). What a young collection
cannot free are frozen objects that become cyclic garbage later (a planner
engine rebuilt cold, caches replaced after a reconverge). A full collection
(unfreeze, collect, freeze) reclaims them. It is due after a whole read, and
once the objects frozen since the last full one reach GROWTH of what that
one kept, so frozen garbage stays below that share of the live heap (plus
one revision); they are counted as they are frozen, from the young
generations (a few hundred objects a commit: `gc.get_freeze_count()` walks
the whole frozen list, 0.35 s at 30,000 nodes). A due collection runs only
when the loop has been idle IDLE_S (`idle`), never on the path of a commit;
a commit that lands during one waits for it (seconds at 100,000 nodes,
once after a start and then about every GROWTH of the heap in new objects).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("gpuaas.loop")

GROWTH = 0.25  # a full collection is due once this share of the kept heap was frozen since the last one
IDLE_S = 2.0  # ... and runs once no revision was applied for this long
# Commits between young collections. Each walks what is young and alive: the new state's copies of
# the path and source tables (200,000 entries each at 100,000 nodes, about 10 ms) and the commits'
# garbage, so collecting every 8th commit costs an eighth, and holds at most 8 commits' cycles.
YOUNG_EVERY = 8


class Heap:
    """When to collect what, for one loop (module docstring)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        growth: float = GROWTH,
        idle_s: float = IDLE_S,
        young_every: int = YOUNG_EVERY,
    ) -> None:
        self.clock, self.growth, self.idle_s, self.young_every = clock, growth, idle_s, young_every
        self.unsettled = 0  # commits since the last young collection (their objects are still young)
        self.baseline: int | None = None  # objects the last full collection kept frozen (None: none yet)
        self.frozen_since = 0  # objects frozen since (an upper bound: some have died since)
        self.due = False
        self.settled_at = clock()
        self.young_collections = 0
        self.full_collections = 0
        self.last_full_s = 0.0
        self.last_freed = 0

    def settle(self, *, whole: bool) -> None:
        """After an applied revision (`whole`: read whole, not by delta): its own garbage collected
        unless that is a full walk, what lives on frozen."""
        if whole:
            gc.freeze()
            self.due = True
        else:
            self.unsettled += 1
            if self.unsettled >= self.young_every:
                self.unsettled = 0
                self.young_collections += 1
                gc.collect()  # generations 0-2 only: the frozen (permanent) one is not walked
                self.frozen_since += sum(len(gc.get_objects(generation)) for generation in range(3))
                gc.freeze()
            if self.baseline is None or self.frozen_since > self.baseline * self.growth:
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
        self.baseline, self.frozen_since = gc.get_freeze_count(), 0  # one walk, beside the collection's
        self.due = False
        self.full_collections += 1
        self.last_full_s = time.perf_counter() - t0
        log.info(
            "full collection while idle: %d freed, %d kept, %.2fs", self.last_freed, self.baseline, self.last_full_s
        )
        return True
