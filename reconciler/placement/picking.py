"""Choosing a node for one request: tiers, whole nodes, and one slice strategy per policy.

A tenant's own nodes (`org` = tenant) come first, shared ones second (seed
002): the policy ranks only inside a tier, and a shared node is taken only
when no node of the tenant's own can take the request. The tier is an
argument all the way down: it names the partitions (`FleetState.slice_lists`)
a strategy is handed.

Picking reads the indexes and never moves a node; `placing.Engine` claims
what it picks.
"""

from __future__ import annotations

from typing import Protocol

from desired import models as m
from reconciler import plans
from reconciler.placement.fleetstate import FleetState, Node
from reconciler.placement.index import NodeKey, SliceIndex
from reconciler.placement.requests import TIERS, Request, Tier
from reconciler.placement.strategies import Buckets, ByEnd, Interleaved, Patterns, same_score


class Strategy(Protocol):
    """How slice requests pick a node among the partitions of one tier."""

    def pick(self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex]) -> tuple[int, int] | None:
        """(node id, positions to claim) of the best node, or None when no node fits."""
        ...

    def alternatives(
        self, req: Request, rule: m.TopologyRule, parts: list[SliceIndex], chosen: int, count: int
    ) -> tuple[plans.Candidate, ...]:
        """Up to `count` next-best nodes but `chosen`, in the order picking would take them."""
        ...


class Picker:
    """The node and slots each request would get, and the alternatives after it, under one policy."""

    def __init__(self, state: FleetState) -> None:
        self.state = state
        patterns = Patterns(state)
        self._buckets = Buckets(state, patterns)
        self._interleaved = Interleaved(state, patterns)
        self._by_end = ByEnd(state, patterns)

    def strategy(self, req: Request) -> Strategy:
        """The lease-end strategy for a lease with an end when the policy ranks by ends, else the policy's own."""
        if self.state.by_end and req.ends_at is not None:
            return self._by_end
        if self.state.by_head:
            return self._interleaved
        return self._buckets

    def pick(
        self, req: Request, rule: m.TopologyRule, whole: bool, alternatives: int
    ) -> tuple[Node, int, tuple[plans.Candidate, ...]] | None:
        """The node and positions for `req`, tier by tier, with up to `alternatives` next-best nodes.

        Alternatives follow the same order: the rest of the winning tier, then the shared tier.
        """
        strategy = self.strategy(req)
        for i, tier in enumerate(TIERS):
            if whole:
                pick = self._pick_whole(req, tier)
            else:
                parts = self.state.slice_lists(req.sku, req.region, req.tenant, tier)
                pick = strategy.pick(req, rule, parts)
            if pick is None:
                continue
            nid, mask = pick
            alts: list[plans.Candidate] = []
            for later in TIERS[i:]:
                if len(alts) >= alternatives:
                    break
                seen = {c.node for c in alts}
                if whole:
                    more = self._whole_alternatives(req, later, nid, alternatives)
                else:
                    parts = self.state.slice_lists(req.sku, req.region, req.tenant, later)
                    more = strategy.alternatives(req, rule, parts, nid, alternatives)
                alts += [c for c in more if c.node not in seen][: alternatives - len(alts)]
            return self.state.nodes[nid], mask, tuple(alts)
        return None

    def _pick_whole(self, req: Request, tier: Tier) -> tuple[int, int] | None:
        """The head of the request's empty-node heaps; among nodes as good, one that caches the image."""
        parts = self.state.whole_lists(req.sku, req.region, req.tenant, tier)
        best: tuple[NodeKey, int] | None = None
        for part in parts:
            top = part.empty.peek()
            if top is not None and (best is None or top < best):
                best = top
        if best is None:
            return None
        patterns = self._buckets.patterns
        if req.image_digest and not patterns.is_warm(req.image_digest, best[1]):
            warm: tuple[NodeKey, int] | None = None
            for part in parts:
                for nid in patterns.warm_candidates(req.image_digest, part.empty):
                    key = part.empty.key_of(nid)
                    if key is not None and same_score(key, best[0]) and (warm is None or key < warm[0]):
                        warm = (key, nid)
            best = warm or best
        return best[1], self.state.nodes[best[1]].all_mask

    def _whole_alternatives(self, req: Request, tier: Tier, chosen: int, count: int) -> tuple[plans.Candidate, ...]:
        heads = sorted(
            h
            for part in self.state.whole_lists(req.sku, req.region, req.tenant, tier)
            for h in part.empty.smallest(count + 1)
            if h[1] != chosen
        )
        return tuple(plans.Candidate(self.state.nodes[nid].name, ()) for _, nid in heads[:count])
