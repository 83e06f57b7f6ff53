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

Whole-node leases use a plain heap of empty nodes per partition.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

NodeKey = tuple[float, ...]


class NodeHeap:
    """Nodes ordered by a tie-break key; lazy deletion keeps updates cheap."""

    __slots__ = ("_heap", "_keys")

    def __init__(self) -> None:
        self._heap: list[tuple[NodeKey, int]] = []
        self._keys: dict[int, NodeKey] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, node: int) -> bool:
        return node in self._keys

    def add(self, node: int, key: NodeKey) -> None:
        if self._keys.get(node) == key:
            return
        self._keys[node] = key
        heapq.heappush(self._heap, (key, node))

    def discard(self, node: int) -> None:
        if self._keys.pop(node, None) is not None and len(self._heap) > 2 * len(self._keys) + 64:
            self._heap = [(k, n) for n, k in self._keys.items()]
            heapq.heapify(self._heap)

    def peek(self) -> tuple[NodeKey, int] | None:
        heap, keys = self._heap, self._keys
        while heap:
            key, node = heap[0]
            if keys.get(node) == key:
                return key, node
            heapq.heappop(heap)
        return None

    def nodes(self) -> Iterator[int]:
        return iter(self._keys)

    def smallest(self, k: int) -> list[tuple[NodeKey, int]]:
        """The k live heads in order, without popping: O(k log k) plus stale entries met."""
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


BucketKey = tuple[int, int]  # (layout id, free mask)


class SliceIndex:
    """Nodes of one partition (SKU, region, org, demand mix), by free pattern."""

    __slots__ = ("buckets", "free_gpus", "mix_id", "nodes_with_free", "place", "sig_count")

    def __init__(self, mix_id: int) -> None:
        self.mix_id = mix_id
        # signature id -> (layout id, mask) -> heap
        self.buckets: dict[int, dict[BucketKey, NodeHeap]] = {}
        self.sig_count: dict[int, int] = {}  # non-empty signatures only
        self.place: dict[int, tuple[int, BucketKey, int]] = {}  # node -> (sig, bucket, free)
        self.free_gpus = 0
        self.nodes_with_free = 0

    def __len__(self) -> int:
        return len(self.place)

    def add(self, node: int, sig: int, bucket: BucketKey, free: int, key: NodeKey) -> None:
        by_mask = self.buckets.get(sig)
        if by_mask is None:
            by_mask = self.buckets[sig] = {}
        heap = by_mask.get(bucket)
        if heap is None:
            heap = by_mask[bucket] = NodeHeap()
        heap.add(node, key)
        self.sig_count[sig] = self.sig_count.get(sig, 0) + 1
        self.place[node] = (sig, bucket, free)
        self.free_gpus += free
        if free:
            self.nodes_with_free += 1

    def remove(self, node: int) -> None:
        sig, bucket, free = self.place.pop(node)
        by_mask = self.buckets[sig]
        heap = by_mask[bucket]
        heap.discard(node)
        if not heap:
            del by_mask[bucket]
        n = self.sig_count[sig] - 1
        if n:
            self.sig_count[sig] = n
        else:
            del self.sig_count[sig]
            del self.buckets[sig]
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
