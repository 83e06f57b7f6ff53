"""The placement state of one fleet: nodes, their claims, and the indexes picking reads.

`FleetState` interns what repeats fleet-wide (slot layouts, size mixes,
free-slot signatures) and keeps every node in the partitions it serves
(`index.SliceIndex` per slice SKU x region x org x size mix,
`index.WholeNodeIndex` per baremetal SKU x region x org), re-indexed on
every claim and release. It also brings a kept state to what a fresh one
would hold for a new revision, node by node (`reset_node`, `locate`,
`retime`, `recache`), which is what makes warm re-planning cheap.

Memos that other parts of the engine derive from this state read
`freed_version` and `facts_version` to know when to forget.

Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from desired import models as m
from desired.state import DesiredState
from policies import fabric, packing
from policies import topology as t
from reconciler import plans
from reconciler.placement import fleetgraph
from reconciler.placement.index import SliceIndex, WholeNodeIndex
from reconciler.placement.requests import Tier, claim_order, lease_end
from schemas import states


class NodeView(Protocol):
    """What callers outside the engine may read of one node."""

    @property
    def name(self) -> str: ...
    @property
    def facts(self) -> fleetgraph.NodeFacts: ...
    @property
    def slot_indexes(self) -> tuple[int, ...]: ...
    @property
    def exclusive(self) -> str | None: ...
    @property
    def claimed(self) -> int: ...


class Node:
    """One node's facts, claims and partitions; changed only through `FleetState`."""

    __slots__ = (
        "all_mask",
        "allocs",
        "ends",
        "exclusive",
        "facts",
        "id",
        "name",
        "since",
        "slot_indexes",
        "views",
        "whole_ok",
        "wholes",
    )

    def __init__(self, nid: int, facts: fleetgraph.NodeFacts) -> None:
        self.id = nid
        self.name = facts.name
        self.allocs: dict[str, int] = {}  # allocation id -> claimed positions
        self.since: dict[str, float] = {}  # allocation id -> requested_at
        self.ends: dict[str, float] = {}  # allocation id -> lease end (packing.NO_END without a term)
        self.exclusive: str | None = None
        self.set_facts(facts)

    def set_facts(self, facts: fleetgraph.NodeFacts) -> None:
        self.facts = facts
        self.slot_indexes = tuple(s.index for s in facts.slots)
        self.all_mask = (1 << len(self.slot_indexes)) - 1
        # (index, layout id, layout) per slice SKU this node serves
        self.views: list[tuple[SliceIndex, int, t.Layout]] = []
        self.wholes: list[WholeNodeIndex] = []
        # may be leased whole once empty: active, healthy, every slot cleaned, no slot drifted
        self.whole_ok = facts.active and facts.cleanup_pending == 0 and facts.host_blocked == 0

    @property
    def claimed(self) -> int:
        out = 0
        for mask in self.allocs.values():
            out |= mask
        return out

    def slots(self, mask: int) -> tuple[int, ...]:
        """The slot indexes of the positions in `mask`."""
        return tuple(self.slot_indexes[p] for p in t.positions(mask))


class FleetState:
    """Nodes, claims and partitions of one fleet under one policy."""

    def __init__(
        self,
        desired: DesiredState,
        observed: plans.Observed,
        *,
        policy: packing.Policy,
        shares: Mapping[int, float],
        lease_end_weight: float,
    ) -> None:
        self.policy = policy
        self.seed_rank = packing.slot_tiebreak(policy)
        self.by_end = packing.uses_lease_ends(policy)
        self.by_head = packing.interleaves(policy)
        self.lease_end_weight = lease_end_weight
        self.shares = dict(shares)
        self.skus = desired.skus
        self.warnings: list[str] = []
        facts = fleetgraph.inventory(desired, observed)
        self._facts: tuple[fleetgraph.NodeFacts, ...] | None = facts  # None: read again off the nodes (`facts`)
        self.nodes = [Node(i, f) for i, f in enumerate(facts)]
        self.by_name = {n.name: n for n in self.nodes}
        self._requested = {a.id: a.requested_at.timestamp() for a in desired.allocations.values()}
        self._lease_ends = {a.id: end for a in desired.allocations.values() if (end := lease_end(a)) is not None}
        self.where: dict[str, Node] = {}  # allocation id -> node
        # image digest -> ids of nodes whose host reported it cached (the warm-cache tie-break)
        self.warm: dict[str, frozenset[int]] = {}
        self.recache({}, observed.image_cache)
        # interning: layouts, size mixes and free-slot signatures repeat fleet-wide
        self.layouts: list[t.Layout] = []
        self._layout_ids: dict[tuple[Any, ...], int] = {}
        self._raw_layouts: dict[tuple[Any, ...], int] = {}
        self.mixes: list[packing.Mix] = []
        self._mix_ids: dict[packing.Mix, int] = {}
        self._mix_of: dict[tuple[str, bool], int] = {}
        self._sig_of: dict[tuple[int, int], int] = {}
        self._sig_ids: dict[tuple[Any, ...], int] = {}
        # partitions
        self.slice_parts: dict[tuple[str, str, str | None, int], SliceIndex] = {}
        self.whole_parts: dict[tuple[str, str, str | None], WholeNodeIndex] = {}
        self._slice_lists: dict[tuple[str, str, str, Tier], list[SliceIndex]] = {}
        self._whole_lists: dict[tuple[str, str, str, Tier], list[WholeNodeIndex]] = {}
        self.empty_nodes = 0
        # (region, pool) -> nodes with no claim that a whole-host request could take (`Node.whole_ok`)
        self.empty_hosts: dict[tuple[str, str], int] = {}
        # bumped when a claim may have gone from a slot / when a node's facts were swapped
        self.freed_version = 0
        self.facts_version = 0
        self._slice_skus = sorted(
            (s for s in self.skus.values() if s.capacity_shape is m.CapacityShape.GPU_SLICE), key=lambda s: s.sku
        )
        for node in self.nodes:
            self._view_node(node)
        self._load_claims(observed.claims)
        for node in self.nodes:
            if not node.allocs:
                self._emptied(node, 1)
            self.index(node)

    # ------------------------------------------------------------------ build

    def _layout_id(self, node: Node, positions: list[int]) -> tuple[int, t.Layout]:
        slots = node.facts.slots
        raw = (tuple((p, slots[p].group, slots[p].pair) for p in positions), node.slot_indexes)
        lid = self._raw_layouts.get(raw)
        if lid is not None:
            return lid, self.layouts[lid]
        groups: dict[str, dict[str, list[int]]] = {}
        for p in positions:
            s = slots[p]
            unit = s.pair if s.pair is not None else f"\0{p}"
            groups.setdefault(s.group, {}).setdefault(unit, []).append(p)
        lay = t.layout(g.values() for g in groups.values())
        key = (lay.groups, node.slot_indexes)
        lid = self._layout_ids.get(key)
        if lid is None:
            lid = self._layout_ids[key] = len(self.layouts)
            self.layouts.append(lay)
        self._raw_layouts[raw] = lid
        return lid, self.layouts[lid]

    def _mix_id(self, mix: packing.Mix) -> int:
        mid = self._mix_ids.get(mix)
        if mid is None:
            mid = self._mix_ids[mix] = len(self.mixes)
            self.mixes.append(mix)
        return mid

    def _whole_skus(self, f: fleetgraph.NodeFacts) -> list[m.Sku]:
        sku = self.skus.get(f.baremetal_sku or "")
        if sku is None or sku.capacity_shape is not m.CapacityShape.BAREMETAL:
            return []
        if f.slots and not any(fabric.fabric_serves(sku.network_fabric, s.fabric) for s in f.slots):
            return []
        return [sku]

    def _view_node(self, node: Node) -> None:
        """Put one (unindexed) node into the partitions its facts serve."""
        f = node.facts
        if not f.active:
            return
        wholes = self._whole_skus(f)
        for sku in wholes:
            part = self.whole_parts.setdefault((sku.sku, f.region, f.org), WholeNodeIndex())
            part.members += 1
            node.wholes.append(part)
        if not f.slice_capable:
            return
        for sku in self._slice_skus:
            positions = [
                p
                for p, s in enumerate(f.slots)
                if s.sellable and fabric.mismatch(sku, s.gpu_model, s.fabric, s.pinned_sku) is None
            ]
            if not positions:
                continue
            lid, lay = self._layout_id(node, positions)
            mid = self._mix_of.get((sku.sku, bool(wholes)))
            if mid is None:
                rules = {g: sku.topology_policy.rule(g) for g in sku.counts}
                mid = self._mix_of[(sku.sku, bool(wholes))] = self._mix_id(
                    packing.mix(self.shares, rules, whole_node=bool(wholes))
                )
            key = (sku.sku, f.region, f.org, mid)
            view = self.slice_parts.get(key)
            if view is None:
                view = self.slice_parts[key] = SliceIndex(key[3], by_end=self.by_end, by_head=self.by_head)
            node.views.append((view, lid, lay))

    def _load_claims(self, claims: Iterable[plans.ExistingClaim]) -> None:
        for c in sorted(claims, key=claim_order):
            node = self.by_name.get(c.node)
            if node is None:
                self.warnings.append(f"claim of {c.allocation_id} on unknown node {c.node}")
                continue
            prev = self.where.get(c.allocation_id)
            if prev is not None and prev is not node:
                self.warnings.append(f"allocation {c.allocation_id} holds claims on {prev.name} and {node.name}")
            self.where.setdefault(c.allocation_id, node)
            self._load_claim(node, c)

    def _load_claim(self, node: Node, c: plans.ExistingClaim) -> None:
        node.since[c.allocation_id] = self._requested.get(c.allocation_id, 0.0)
        node.ends[c.allocation_id] = self._lease_ends.get(c.allocation_id, packing.NO_END)
        if c.kind is states.ClaimKind.NODE_EXCLUSIVE:
            node.exclusive = c.allocation_id
            node.allocs[c.allocation_id] = node.all_mask
            return
        try:
            pos = node.slot_indexes.index(c.slot_index if c.slot_index is not None else -1)
        except ValueError:
            self.warnings.append(f"claim of {c.allocation_id} on unknown slot {c.node}/{c.slot_index}")
            return
        node.allocs[c.allocation_id] = node.allocs.get(c.allocation_id, 0) | (1 << pos)

    # ---------------------------------------------------------- warm upkeep
    #
    # A state kept across revisions is brought to what a fresh one would hold
    # for the new desired state and observed claims, one node at a time. The
    # node set (and so every node id, the last tie-break) must not change.

    def reset_node(
        self, name: str, claims: Iterable[plans.ExistingClaim], facts: fleetgraph.NodeFacts | None = None
    ) -> set[str]:
        """Make one node exactly what `__init__` builds: new `facts` (when given) and exactly `claims`.

        `claims` are the observed claims on this node in `claim_order`. Returns
        the allocation ids held here before or now: their `where` may have
        moved, and the caller settles each with `locate` once every node is reset.
        """
        node = self.by_name[name]
        self.unindex(node)
        self.freed_version += 1
        if not node.allocs:
            self._emptied(node, -1)  # counted under its old facts
        touched = set(node.since)
        node.allocs.clear()
        node.since.clear()
        node.ends.clear()
        node.exclusive = None
        if facts is not None:
            self._refact(node, facts)
        for c in claims:
            self._load_claim(node, c)
            touched.add(c.allocation_id)
        if not node.allocs:
            self._emptied(node, 1)
        self.index(node)
        return touched

    def _refact(self, node: Node, facts: fleetgraph.NodeFacts) -> None:
        """Swap an unindexed, claimless node's facts and partitions (a new slot map, a drain, health)."""
        for w in node.wholes:
            w.members -= 1
        node.set_facts(facts)
        self._view_node(node)
        self._facts = None
        # what was read off the old facts: partition lists (a partition may be new) and every memo of facts
        self._slice_lists.clear()
        self._whole_lists.clear()
        self.facts_version += 1
        self.freed_version += 1

    def locate(self, allocation_id: str, nodes: Iterable[str]) -> None:
        """Where an allocation is held: the first known node of its observed claims, as `_load_claims` picks."""
        known = [n for n in nodes if n in self.by_name]
        if known:
            self.where[allocation_id] = self.by_name[min(known)]
        else:
            self.where.pop(allocation_id, None)

    def retime(self, allocation_id: str, alloc: m.Allocation | None) -> bool:
        """Read an allocation's request time and lease end from its new document (None: deleted).

        True when either changed: the nodes holding it must be reset (their tie-break keys use them).
        """
        before = (self._requested.get(allocation_id), self._lease_ends.get(allocation_id))
        if alloc is None:
            self._requested.pop(allocation_id, None)
            self._lease_ends.pop(allocation_id, None)
            return before != (None, None)
        self._requested[allocation_id] = alloc.requested_at.timestamp()
        end = lease_end(alloc)
        if end is None:
            self._lease_ends.pop(allocation_id, None)
        else:
            self._lease_ends[allocation_id] = end
        return before != (self._requested[allocation_id], end)

    def recache(self, before: Mapping[str, frozenset[str]], after: Mapping[str, frozenset[str]]) -> None:
        """Move the warm-image sets from one observed image cache to the next (only nodes that changed)."""
        gone: dict[str, set[int]] = {}
        came: dict[str, set[int]] = {}
        for name in before.keys() | after.keys():
            old, new = before.get(name, frozenset()), after.get(name, frozenset())
            node = self.by_name.get(name)
            if old == new or node is None:
                continue
            for d in set(old) - set(new):
                gone.setdefault(d, set()).add(node.id)
            for d in set(new) - set(old):
                came.setdefault(d, set()).add(node.id)
        for d in gone.keys() | came.keys():
            ids = (self.warm.get(d, frozenset()) - gone.get(d, set())) | came.get(d, set())
            if ids:
                self.warm[d] = frozenset(ids)
            else:
                self.warm.pop(d, None)

    @property
    def facts(self) -> tuple[fleetgraph.NodeFacts, ...]:
        """Every node's facts, in node order."""
        if self._facts is None:
            self._facts = tuple(n.facts for n in self.nodes)
        return self._facts

    # ------------------------------------------------------------ index upkeep

    def _sig(self, lid: int, mask: int) -> int:
        sig = self._sig_of.get((lid, mask))
        if sig is None:
            canon = t.signature(self.layouts[lid], mask)
            sig = self._sig_ids.setdefault(canon, len(self._sig_ids))
            self._sig_of[(lid, mask)] = sig
        return sig

    def index(self, node: Node) -> None:
        """Put a node into its partitions' buckets under its present free slots and tie-break key."""
        claimed = node.claimed
        key = packing.node_key(self.policy, node.id, len(node.allocs), min(node.since.values()) if node.since else 0.0)
        end = packing.node_end(node.ends.values()) if self.by_end else 0.0
        for part, lid, lay in node.views:
            free = lay.full & ~claimed
            part.add(node.id, self._sig(lid, free), (lid, free), free.bit_count(), key, end=end)
        if not node.allocs and node.whole_ok:
            wkey = packing.baremetal_key(self.policy, node.id, bool(node.views))
            for w in node.wholes:
                w.empty.add(node.id, wkey)

    def unindex(self, node: Node) -> None:
        """Take a node out of every bucket (to change it, or to hide it from one request)."""
        for part, _, _ in node.views:
            part.remove(node.id)
        if not node.allocs:
            for w in node.wholes:
                w.empty.discard(node.id)

    def claim(self, node: Node, allocation_id: str, mask: int, *, exclusive: bool, since: float, end: float) -> None:
        self.unindex(node)
        if not node.allocs:
            self._emptied(node, -1)
        node.allocs[allocation_id] = mask
        node.since[allocation_id] = since
        node.ends[allocation_id] = end
        if exclusive:
            node.exclusive = allocation_id
        self.where[allocation_id] = node
        self.index(node)

    def release(self, allocation_id: str) -> bool:
        """Free every slot the allocation holds (its cleanup is assumed done)."""
        node = self.where.pop(allocation_id, None)
        if node is None:
            return False
        self.freed_version += 1  # a freed slot may be one its host reports drifted
        self.unindex(node)
        del node.allocs[allocation_id]
        del node.since[allocation_id]
        del node.ends[allocation_id]
        if node.exclusive == allocation_id:
            node.exclusive = None
        if not node.allocs:
            self._emptied(node, 1)
        self.index(node)
        return True

    def _emptied(self, node: Node, step: int) -> None:
        """A node became empty (+1) or stopped being empty (-1): the fleet's and its pool's counts."""
        self.empty_nodes += step
        if node.whole_ok:
            key = (node.facts.region, node.facts.pool)
            self.empty_hosts[key] = self.empty_hosts.get(key, 0) + step

    # ------------------------------------------------------------ partitions

    def slice_lists(self, sku: str, region: str, tenant: str, tier: Tier) -> list[SliceIndex]:
        """The slice partitions a tenant's request of `tier` looks at, in size-mix order."""
        key = (sku, region, tenant, tier)
        parts = self._slice_lists.get(key)
        if parts is None:
            parts = self._slice_lists[key] = [
                p
                for (s, r, org, _), p in sorted(self.slice_parts.items(), key=lambda kv: kv[1].mix_id)
                if s == sku and r == region and tier.admits(org, tenant)
            ]
        return parts

    def whole_lists(self, sku: str, region: str, tenant: str, tier: Tier) -> list[WholeNodeIndex]:
        """The whole-node partitions a tenant's request of `tier` looks at."""
        key = (sku, region, tenant, tier)
        parts = self._whole_lists.get(key)
        if parts is None:
            parts = self._whole_lists[key] = [
                p
                for (s, r, org), p in sorted(self.whole_parts.items(), key=lambda kv: str(kv[0]))
                if s == sku and r == region and tier.admits(org, tenant)
            ]
        return parts
