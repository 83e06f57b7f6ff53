"""Index structures for placement: nodes bucketed by free-slot pattern.

A request never walks the fleet. Nodes that can serve one slice SKU in one
(region, org) partition sit in buckets keyed by their free-slot pattern:
signature (the pattern up to symmetry, see `policies.topology.signature`)
-> exact (layout, free mask) -> a heap of nodes in tie-break order. Every
score a policy uses depends only on the signature (plus, for seed-rank, the
slot index of the exact mask), so a query scores each signature present in
the partition once - a handful for 8-slot hosts, whatever the fleet size -
and takes the head of the winning heap. Moving a node after a claim or a
release touches two buckets: O(1) dict work plus an O(log n) heap push.

Under a policy that ranks by lease ends (`policies.packing.uses_lease_ends`)
each signature also keeps its nodes sorted by when they empty (`EndOrder`):
a request with a known end asks each signature for the first node that
empties at or after it (no delay, tightest fit) or else the one that empties
last (the least delay), a binary search per signature. Moving a node
re-sorts one entry in two signatures (binary search plus a list insert: a
memmove of at most one pointer per node of the signature, microseconds at
100,000 nodes).

`default` ranks nodes by facts of the node between the pattern's scores
(`policies.packing.place_key`: a spread shape last, then the node holding
more allocations, then the aligned shape, the oldest allocation by 4-hour class, the
fragmentation gradient). So under `default` each signature also keeps one heap
of its nodes in tie-break order (`heads`): a request peeks the head of every
fitting signature, and the end order is kept per signature *and* allocation
count (`EndGroup`), so a lease with an end asks the groups in order of
(shape class, allocations, ...) and stops at the first group whose bound is
worse than the best key found.

Whole-node leases use a plain heap of empty nodes per partition.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterator

NodeKey = tuple[float, ...]


class NodeHeap:
    """Nodes ordered by a tie-break key; lazy deletion keeps updates cheap.

    With `deferred`, the heap itself is built on the first query (until then
    an update is one dict write): indexes that may never be asked for this
    order (a policy ranking by lease ends, fed only leases with ends) skip it.
    """

    __slots__ = ("_built", "_heap", "_keys")

    def __init__(self, *, deferred: bool = False) -> None:
        self._heap: list[tuple[NodeKey, int]] = []
        self._keys: dict[int, NodeKey] = {}
        self._built = not deferred

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, node: int) -> bool:
        return node in self._keys

    def add(self, node: int, key: NodeKey) -> None:
        if self._keys.get(node) == key:
            return
        self._keys[node] = key
        if self._built:
            heapq.heappush(self._heap, (key, node))

    def discard(self, node: int) -> None:
        if self._keys.pop(node, None) is not None and self._built and len(self._heap) > 2 * len(self._keys) + 64:
            self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(k, n) for n, k in self._keys.items()]
        heapq.heapify(self._heap)
        self._built = True

    def peek(self) -> tuple[NodeKey, int] | None:
        if not self._built:
            self._rebuild()
        heap, keys = self._heap, self._keys
        while heap:
            key, node = heap[0]
            if keys.get(node) == key:
                return key, node
            heapq.heappop(heap)
        return None

    def nodes(self) -> Iterator[int]:
        return iter(self._keys)

    def key_of(self, node: int) -> NodeKey | None:
        """The node's tie-break key, None when it is not in this heap."""
        return self._keys.get(node)

    def smallest(self, k: int) -> list[tuple[NodeKey, int]]:
        """The k live heads in order, without popping: O(k log k) plus stale entries met."""
        if not self._built:
            self._rebuild()
        heap, keys = self._heap, self._keys
        out: list[tuple[NodeKey, int]] = []
        seen: set[int] = set()
        frontier: list[tuple[tuple[NodeKey, int], int]] = [(heap[0], 0)] if heap else []
        while frontier and len(out) < k:
            (key, node), i = heapq.heappop(frontier)
            if keys.get(node) == key and node not in seen:
                seen.add(node)
                out.append((key, node))
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return out


EndEntry = tuple[float, NodeKey, int]  # (when the node empties, tie-break key, node)


class EndOrder:
    """Nodes sorted by when they empty, then by their tie-break key.

    Nodes without allocations (`end` = -inf: they are empty already) all tie
    and sit in a heap by key instead of the sorted list.
    """

    __slots__ = ("_empty", "_entry", "_items")

    def __init__(self) -> None:
        self._items: list[EndEntry] = []
        self._entry: dict[int, EndEntry] = {}
        self._empty = NodeHeap()

    def __len__(self) -> int:
        return len(self._items) + len(self._empty)

    def add(self, node: int, end: float, key: NodeKey) -> None:
        entry = (end, key, node)
        old = self._entry.get(node)
        if old == entry:
            return
        if old is not None:
            self.discard(node)
        self._entry[node] = entry
        if end == -math.inf:
            self._empty.add(node, key)
        else:
            bisect.insort(self._items, entry)

    def discard(self, node: int) -> None:
        old = self._entry.pop(node, None)
        if old is None:
            return
        if old[0] == -math.inf:
            self._empty.discard(node)
        else:
            del self._items[bisect.bisect_left(self._items, old)]

    def at_or_after(self, t: float) -> EndEntry | None:
        """The node that empties first at or after `t` (least key among equals)."""
        i = bisect.bisect_left(self._items, (t,))
        return self._items[i] if i < len(self._items) else None

    def latest_before(self, t: float) -> EndEntry | None:
        """The node that empties last before `t` (least key among equals)."""
        items = self._items
        i = bisect.bisect_left(items, (t,))
        if i == 0:
            return None
        end = items[i - 1][0]
        return items[bisect.bisect_left(items, (end,), 0, i)]

    def first_empty(self) -> EndEntry | None:
        """The empty node (no allocation) with the least key."""
        top = self._empty.peek()
        return None if top is None else (-math.inf, top[0], top[1])

    def around(self, t: float, k: int) -> list[EndEntry]:
        """Up to k nodes each side of `t` and the k first empty ones (alternatives: read-only)."""
        items = self._items
        i = bisect.bisect_left(items, (t,))
        empty = [(-math.inf, key, node) for key, node in self._empty.smallest(k)]
        return items[i : i + k] + items[max(0, i - k) : i] + empty


BucketKey = tuple[int, int]  # (layout id, free mask)
EndGroup = tuple[int, float]  # (signature id, first element of the nodes' tie-break key: -allocations)


class SliceIndex:
    """Nodes of one partition (SKU, region, org, demand mix), by free pattern."""

    __slots__ = (
        "buckets",
        "end_version",
        "ends",
        "free_gpus",
        "heads",
        "mix_id",
        "nodes_with_free",
        "place",
        "sig_count",
        "sig_version",
    )

    def __init__(self, mix_id: int, *, by_end: bool = False, by_head: bool = False) -> None:
        self.mix_id = mix_id
        # signature id -> (layout id, mask) -> heap
        self.buckets: dict[int, dict[BucketKey, NodeHeap]] = {}
        # signature id -> its nodes with a free slot in tie-break order (policies that interleave node facts)
        self.heads: dict[int, NodeHeap] | None = {} if by_head else None
        # (signature id, key[0]) -> nodes by when they empty; only for policies that rank by lease ends
        self.ends: dict[EndGroup, EndOrder] | None = {} if by_end else None
        self.end_version = 0  # bumped whenever an end group appears or disappears (cache key)
        self.sig_count: dict[int, int] = {}  # non-empty signatures only
        self.sig_version = 0  # bumped whenever a signature appears or disappears (cache key)
        self.place: dict[int, tuple[int, BucketKey, int]] = {}  # node -> (sig, bucket, free)
        self.free_gpus = 0
        self.nodes_with_free = 0

    def __len__(self) -> int:
        return len(self.place)

    def add(self, node: int, sig: int, bucket: BucketKey, free: int, key: NodeKey, *, end: float = 0.0) -> None:
        """Index a node; `end` is when it empties (kept only when the index orders by ends)."""
        by_mask = self.buckets.get(sig)
        if by_mask is None:
            by_mask = self.buckets[sig] = {}
            self.sig_version += 1
        heap = by_mask.get(bucket)
        if heap is None:
            heap = by_mask[bucket] = NodeHeap(deferred=self.ends is not None or self.heads is not None)
        heap.add(node, key)
        if free and self.heads is not None:  # a node with no free slot takes no slice: not ordered
            head = self.heads.get(sig)
            if head is None:
                head = self.heads[sig] = NodeHeap()
            head.add(node, key)
        if free and self.ends is not None:
            group = (sig, key[0])
            order = self.ends.get(group)
            if order is None:
                order = self.ends[group] = EndOrder()
                self.end_version += 1
            order.add(node, end, key)
        self.sig_count[sig] = self.sig_count.get(sig, 0) + 1
        self.place[node] = (sig, bucket, free)
        self.free_gpus += free
        if free:
            self.nodes_with_free += 1

    def remove(self, node: int) -> None:
        sig, bucket, free = self.place.pop(node)
        by_mask = self.buckets[sig]
        heap = by_mask[bucket]
        key = heap.key_of(node)
        heap.discard(node)
        if not heap:
            del by_mask[bucket]
        if free and self.heads is not None:
            head = self.heads[sig]
            head.discard(node)
            if not head:
                del self.heads[sig]
        if free and self.ends is not None and key is not None:
            group = (sig, key[0])
            order = self.ends[group]
            order.discard(node)
            if not order:
                del self.ends[group]
                self.end_version += 1
        n = self.sig_count[sig] - 1
        if n:
            self.sig_count[sig] = n
        else:
            del self.sig_count[sig]
            del self.buckets[sig]
            self.sig_version += 1
        self.free_gpus -= free
        if free:
            self.nodes_with_free -= 1


class WholeNodeIndex:
    """Empty nodes that one baremetal SKU may lease in one (region, org) partition."""

    __slots__ = ("empty", "members")

    def __init__(self) -> None:
        self.empty = NodeHeap()
        self.members = 0  # every node of the partition, empty or not

    def __len__(self) -> int:
        return len(self.empty)
