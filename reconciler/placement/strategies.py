"""The three ways a slice request picks a node, each one strategy object.

Each strategy answers two questions for one request over the partitions
its tier admits (`picking.Strategy`): which node and slots to claim
(`pick`), and which nodes apply should try next after losing a race
(`alternatives`, read-only). `picking.Picker` chooses the strategy per
request from the policy and whether the lease has an end:

- `Buckets`: the free patterns the policy ranks first, then the best
  tie-break key among their buckets' heads (every policy but `default`).
- `Interleaved`: `default` for a lease without an end; node facts sit
  between the pattern's scores (`packing.place_key`), so every fitting
  pattern's head is compared.
- `ByEnd`: `default` for a lease with an end; the key adds the delay the
  lease causes to when the node empties (`packing.lease_key`).

`Patterns` holds what they share: pattern ranks and in-node choices
(memoised per layout, free mask, size and rule: they repeat fleet-wide)
and the warm-image candidates.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from desired import models as m
from policies import packing
from policies import topology as t
from reconciler import plans
from reconciler.placement.fleetstate import FleetState
from reconciler.placement.index import EndOrder, NodeHeap, NodeKey, SliceIndex
from reconciler.placement.requests import Request

_MISSING: Any = object()
# one end group of a partition for one request shape: (packing.lease_bound, pattern rank, (signature, -allocations))
_Group = tuple[tuple[float, ...], tuple[float, ...], tuple[int, float]]
_WARM_SCAN = 256  # above this many warm nodes, look only at the heads of the winning buckets


def same_score(a: NodeKey, b: NodeKey) -> bool:
    """Equal placement keys but for the node order (always the last element)."""
    return a[:-1] == b[:-1]


class Patterns:
    """Ranks and in-node choices of free patterns under one policy, memoised, and the warm-image lookup."""

    def __init__(self, state: FleetState) -> None:
        self.state = state
        self.ranks: dict[tuple[int, int, m.TopologyRule], dict[int, tuple[float, ...] | None]] = {}
        self._choices: dict[tuple[int, int, int, m.TopologyRule, int], t.Choice | None] = {}

    def rank(self, part: SliceIndex, sig: int, g: int, rule: m.TopologyRule) -> tuple[float, ...] | None:
        """How the policy ranks one free pattern for g GPUs (None: it does not fit); not memoised."""
        lid, mask = next(iter(part.buckets[sig]))
        s = self.state
        opt = packing.option(s.policy, s.layouts[lid], mask, g, rule, demands=s.mixes[part.mix_id])
        return None if opt is None else packing.rank(s.policy, opt)

    def ranks_of(self, part: SliceIndex, g: int, rule: m.TopologyRule) -> dict[int, tuple[float, ...] | None]:
        """The memo of ranks (signature -> rank) for this partition's size mix, g and rule."""
        key = (part.mix_id, g, rule)
        ranks = self.ranks.get(key)
        if ranks is None:
            ranks = self.ranks[key] = {}
        return ranks

    def choice(self, lid: int, mask: int, g: int, rule: m.TopologyRule, mix_id: int) -> t.Choice:
        """The slots the policy takes for g GPUs from free `mask` of layout `lid`."""
        key = (lid, mask, g, rule, mix_id)
        if key in self._choices:
            c = self._choices[key]
        else:
            s = self.state
            lay = s.layouts[lid]
            c = self._choices[key] = packing.in_node(
                s.policy, lay, mask, t.choices(lay, mask, g, rule), s.mixes[mix_id]
            )
        if c is None:
            raise AssertionError("a ranked signature always has a choice")
        return c

    def is_warm(self, digest: str, nid: int) -> bool:
        return nid in self.state.warm.get(digest, ())

    def warm_candidates(self, digest: str | None, heap: NodeHeap) -> Iterable[int]:
        """Nodes of `heap` that cache `digest`, the cheaper way round (few warm nodes, or the heap's heads)."""
        warm = self.state.warm.get(digest or "", frozenset())
        if not warm:
            return ()
        if len(warm) <= _WARM_SCAN:
            return warm
        return [nid for _, nid in heap.smallest(_WARM_SCAN // 8) if nid in warm]

    def sorted_ranks(self, part: SliceIndex, g: int, rule: m.TopologyRule) -> Iterable[tuple[tuple[float, ...], int]]:
        """(rank, signature) of every fitting free pattern of one partition, in the partition's order."""
        ranks = self.ranks_of(part, g, rule)
        for sig in part.sig_count:
            r = ranks.get(sig, _MISSING)
            if r is _MISSING:
                r = ranks[sig] = self.rank(part, sig, g, rule)
            if r is not None:
                yield r, sig


class Buckets:
    """The best-ranked free patterns first, then the smallest tie-break key among their buckets' heads."""

    def __init__(self, state: FleetState, patterns: Patterns) -> None:
        self.state = state
        self.patterns = patterns

    def pick(self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex]) -> tuple[int, int] | None:
        tied = self._best_signatures(req, rule, parts)
        if not tied:
            return None
        g = req.gpu_count
        choice, nodes, seed_rank = self.patterns.choice, self.state.nodes, self.state.seed_rank
        best: tuple[NodeKey, SliceIndex, int, int, int] | None = None
        for part, sig in tied:
            for (lid, mask), heap in part.buckets[sig].items():
                top = heap.peek()
                if top is None:
                    continue
                key = top[0]
                if seed_rank:
                    first = choice(lid, mask, g, rule, part.mix_id).mask
                    key = (nodes[top[1]].slot_indexes[(first & -first).bit_length() - 1], *key)
                if best is None or key < best[0]:
                    best = (key, part, lid, mask, top[1])
        if best is None:
            return None
        if req.image_digest:
            best = self._warm(req.image_digest, tied, g, rule, best)
        _, part, lid, mask, nid = best
        return nid, choice(lid, mask, g, rule, part.mix_id).mask

    def _warm(
        self,
        digest: str,
        tied: list[tuple[SliceIndex, int]],
        g: int,
        rule: m.TopologyRule,
        best: tuple[NodeKey, SliceIndex, int, int, int],
    ) -> tuple[NodeKey, SliceIndex, int, int, int]:
        """Among nodes packed exactly as well as `best`, the first that caches the image (else `best`).

        Equal score = same free pattern rank (every tied signature) and the same
        tie-break key but for the node order, its last element: the image never
        buys a worse fit, a fuller node or a younger one.
        """
        if self.patterns.is_warm(digest, best[4]):
            return best
        warm: tuple[NodeKey, SliceIndex, int, int, int] | None = None
        for part, sig in tied:
            for (lid, mask), heap in part.buckets[sig].items():
                for nid in self.patterns.warm_candidates(digest, heap):
                    key = heap.key_of(nid)
                    if key is None:
                        continue
                    if self.state.seed_rank:
                        first = self.patterns.choice(lid, mask, g, rule, part.mix_id).mask
                        key = (self.state.nodes[nid].slot_indexes[(first & -first).bit_length() - 1], *key)
                    if same_score(key, best[0]) and (warm is None or key < warm[0]):
                        warm = (key, part, lid, mask, nid)
        return warm or best

    def _best_signatures(
        self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex]
    ) -> list[tuple[SliceIndex, int]]:
        """The free patterns, across the request's partitions, that the policy ranks first."""
        g = req.gpu_count
        rank, memo = self.patterns.rank, self.patterns.ranks
        best_rank: tuple[float, ...] | None = None
        tied: list[tuple[SliceIndex, int]] = []
        for part in parts:
            rkey = (part.mix_id, g, rule)  # `Patterns.ranks_of`, inline: this runs per partition per request
            ranks = memo.get(rkey)
            if ranks is None:
                ranks = memo[rkey] = {}
            for sig in part.sig_count:
                r = ranks.get(sig, _MISSING)
                if r is _MISSING:
                    r = ranks[sig] = rank(part, sig, g, rule)
                if r is None:
                    continue
                if best_rank is None or r < best_rank:
                    best_rank = r
                    tied = [(part, sig)]
                elif r == best_rank:
                    tied.append((part, sig))
        return tied

    def alternatives(
        self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex], chosen: int, count: int
    ) -> tuple[plans.Candidate, ...]:
        """Rank group by rank group, the heads of every bucket but the chosen node's, in key order."""
        groups: dict[tuple[float, ...], list[tuple[SliceIndex, int]]] = {}
        for part in parts:
            for r, sig in self.patterns.sorted_ranks(part, req.gpu_count, rule):
                groups.setdefault(r, []).append((part, sig))
        out: list[plans.Candidate] = []
        for r in sorted(groups):
            found = sorted(
                h
                for part, sig in groups[r]
                for h in self._heads(part, sig, req.gpu_count, rule, count + 1)
                if h[1] != chosen
            )
            for _, nid, slots in found:
                out.append(plans.Candidate(self.state.nodes[nid].name, slots))
                if len(out) == count:
                    return tuple(out)
        return tuple(out)

    def _heads(
        self, part: SliceIndex, sig: int, g: int, rule: m.TopologyRule, count: int
    ) -> list[tuple[NodeKey, int, tuple[int, ...]]]:
        """The first `count` nodes of every bucket of one pattern, with the slots each would take."""
        out = []
        for (lid, mask), heap in part.buckets[sig].items():
            taken = self.patterns.choice(lid, mask, g, rule, part.mix_id).mask
            for key, nid in heap.smallest(count):
                node = self.state.nodes[nid]
                first: NodeKey = (node.slot_indexes[(taken & -taken).bit_length() - 1],) if self.state.seed_rank else ()
                out.append(((*first, *key), nid, node.slots(taken)))
        return out


class Interleaved:
    """`default` for a lease without an end: the head of every fitting pattern, by `packing.place_key`."""

    def __init__(self, state: FleetState, patterns: Patterns) -> None:
        self.state = state
        self.patterns = patterns
        self._sorted: dict[tuple[SliceIndex, int, m.TopologyRule], tuple[int, list[tuple[tuple[float, ...], int]]]] = {}

    def pick(self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex]) -> tuple[int, int] | None:
        """Patterns come in rank order, so the first part of the key they fix
        (`packing.place_bound`) never decreases: stop once it is worse than the best.
        """
        g = req.gpu_count
        best: tuple[NodeKey, SliceIndex, int] | None = None
        for part in parts:
            heads = part.heads
            if heads is None:
                raise AssertionError("a policy that interleaves node facts keeps pattern heads")
            for rank, sig in self._sorted_signatures(part, g, rule):
                if best is not None and packing.place_bound(rank) > best[0][:2]:
                    break
                top = heads[sig].peek()  # a fitting pattern has free slots: it has a head
                if top is not None:
                    key = packing.place_key(rank, top[0])
                    if best is None or key < best[0]:
                        best = (key, part, top[1])
        if best is None:
            return None
        if req.image_digest and not self.patterns.is_warm(req.image_digest, best[2]):
            best = self._warm(req, rule, parts, best)
        _, part, nid = best
        lid, mask = part.place[nid][1]
        return nid, self.patterns.choice(lid, mask, g, rule, part.mix_id).mask

    def _warm(
        self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex], best: tuple[NodeKey, SliceIndex, int]
    ) -> tuple[NodeKey, SliceIndex, int]:
        """Among nodes with `best`'s key but for the node order, the first that caches the image (else `best`)."""
        warm: tuple[NodeKey, SliceIndex, int] | None = None
        for part in parts:
            heads = part.heads or {}
            for rank, sig in self._sorted_signatures(part, req.gpu_count, rule):
                heap = heads[sig]
                for nid in self.patterns.warm_candidates(req.image_digest, heap):
                    node_key = heap.key_of(nid)
                    if node_key is None:
                        continue
                    key = packing.place_key(rank, node_key)
                    if same_score(key, best[0]) and (warm is None or key < warm[0]):
                        warm = (key, part, nid)
        return warm or best

    def alternatives(
        self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex], chosen: int, count: int
    ) -> tuple[plans.Candidate, ...]:
        """Next-best nodes under `packing.place_key`: the first few of every fitting pattern's heads."""
        g = req.gpu_count
        nodes = self.state.nodes
        found: dict[int, tuple[NodeKey, tuple[int, ...]]] = {}
        for part in parts:
            heads = part.heads or {}
            for rank, sig in self._sorted_signatures(part, g, rule):
                for node_key, nid in heads[sig].smallest(count + 1):
                    if nid == chosen or nid in found:
                        continue
                    lid, mask = part.place[nid][1]
                    taken = self.patterns.choice(lid, mask, g, rule, part.mix_id).mask
                    found[nid] = (packing.place_key(rank, node_key), nodes[nid].slots(taken))
        best = sorted((key, nid, slots) for nid, (key, slots) in found.items())[:count]
        return tuple(plans.Candidate(nodes[nid].name, slots) for _, nid, slots in best)

    def _sorted_signatures(self, part: SliceIndex, g: int, rule: m.TopologyRule) -> list[tuple[tuple[float, ...], int]]:
        """The fitting free patterns present in one partition with their rank, best first.

        Cached until a pattern appears in or leaves the partition (`sig_version`).
        """
        ckey = (part, g, rule)
        cached = self._sorted.get(ckey)
        if cached is not None and cached[0] == part.sig_version:
            return cached[1]
        out = sorted(self.patterns.sorted_ranks(part, g, rule))
        self._sorted[ckey] = (part.sig_version, out)
        return out


class ByEnd:
    """`default` for a lease with a known end: fragmentation gradient plus the delay it adds.

    No warm-cache tie-break here: the key carries the lease-end delay, so
    two candidates are almost never equal, and the image must not outweigh it.
    """

    def __init__(self, state: FleetState, patterns: Patterns) -> None:
        self.state = state
        self.patterns = patterns
        self._sorted: dict[tuple[SliceIndex, int, m.TopologyRule], tuple[int, list[_Group]]] = {}

    def pick(self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex]) -> tuple[int, int] | None:
        g, start, end = req.gpu_count, req.requested_at, _end(req)
        best: tuple[NodeKey, SliceIndex, int] | None = None
        for part in parts:
            ends = _ends(part)
            for bound, rank, group in self._sorted_groups(part, g, rule):
                # a lease's key is never below its group's bound: later groups cannot win
                if best is not None and bound > best[0][:5]:
                    break
                key, nid = self._end_best(ends[group], start, end, rank)
                if best is None or key < best[0]:
                    best = (key, part, nid)
        if best is None:
            return None
        _, part, nid = best
        lid, mask = part.place[nid][1]
        return nid, self.patterns.choice(lid, mask, g, rule, part.mix_id).mask

    def _end_best(self, order: EndOrder, start: float, end: float, rank: tuple[float, ...]) -> tuple[NodeKey, int]:
        """The best node of one free pattern for a lease from `start` to `end`, with its full key.

        The first node that empties at or after `end` adds no delay and has
        the least slack: every other node of the pattern empties before `end`
        (or is empty, busy from `start`) and is delayed. Without one, the node
        that empties last before `end` or an empty node, whichever is delayed less.
        """
        weight = self.state.lease_end_weight
        hit = order.at_or_after(end)
        if hit is not None and end > start:
            return packing.lease_key(packing.lease_rank(rank, hit[0], start, end, weight), hit[1]), hit[2]
        best: tuple[NodeKey, int] | None = None
        for entry in (hit, order.latest_before(end), order.first_empty()):
            if entry is not None:
                node_end, key, nid = entry
                cand = packing.lease_key(packing.lease_rank(rank, node_end, start, end, weight), key)
                if best is None or cand < best[0]:
                    best = (cand, nid)
        if best is None:
            raise AssertionError("an indexed pattern is never empty")
        return best

    def _sorted_groups(self, part: SliceIndex, g: int, rule: m.TopologyRule) -> list[_Group]:
        """The fitting end groups (pattern, allocation count) of one partition, by `packing.lease_bound`.

        Cached until a group appears in or leaves the partition (`end_version`).
        """
        ckey = (part, g, rule)
        cached = self._sorted.get(ckey)
        if cached is not None and cached[0] == part.end_version:
            return cached[1]
        ends = _ends(part)
        ranks = self.patterns.ranks_of(part, g, rule)
        out = []
        for group in ends:
            sig = group[0]
            r = ranks.get(sig, _MISSING)
            if r is _MISSING:
                r = ranks[sig] = self.patterns.rank(part, sig, g, rule)
            if r is not None:
                out.append((packing.lease_bound(r, group[1]), r, group))
        out.sort()
        self._sorted[ckey] = (part.end_version, out)
        return out

    def alternatives(
        self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex], chosen: int, count: int
    ) -> tuple[plans.Candidate, ...]:
        """Next-best nodes under the lease-end key: the nodes around the end in every fitting bucket."""
        g, start, end, weight = req.gpu_count, req.requested_at, _end(req), self.state.lease_end_weight
        nodes = self.state.nodes
        found: dict[int, tuple[NodeKey, tuple[int, ...]]] = {}
        for part in parts:
            ends = _ends(part)
            for _, rank, group in self._sorted_groups(part, g, rule):
                for node_end, key, nid in ends[group].around(end, count + 1):
                    if nid == chosen or nid in found:
                        continue
                    lid, mask = part.place[nid][1]
                    taken = self.patterns.choice(lid, mask, g, rule, part.mix_id).mask
                    full = packing.lease_key(packing.lease_rank(rank, node_end, start, end, weight), key)
                    found[nid] = (full, nodes[nid].slots(taken))
        best = sorted((key, nid, slots) for nid, (key, slots) in found.items())[:count]
        return tuple(plans.Candidate(nodes[nid].name, slots) for _, nid, slots in best)


def _end(req: Request) -> float:
    if req.ends_at is None:
        raise AssertionError("the lease-end strategy serves leases with an end")
    return req.ends_at


def _ends(part: SliceIndex) -> dict[tuple[int, float], EndOrder]:
    ends = part.ends
    if ends is None:
        raise AssertionError("a policy that ranks by lease ends indexes them")
    return ends
