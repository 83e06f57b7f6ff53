"""The placement engine: one in-memory fleet, placing and releasing requests.

`Engine` is built once from desired state plus observed facts, then answers
`place(request)` and `release(allocation_id)` in time independent of the
fleet size (see `reconciler.placement.index`). `planner.plan()` and the
simulator both drive this class, so what the simulator measures is what the
planner does.

Pure: no I/O, no clock, no randomness; same inputs and same call sequence
give the same answers.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from desired import models as m
from desired.loading import DesiredState
from policies import fabric, modes, packing, profiles
from policies import topology as t
from reconciler import fleetgraph, plans
from reconciler.placement import reasons
from reconciler.placement.index import EndOrder, NodeHeap, NodeKey, SliceIndex, WholeNodeIndex
from schemas import states

Refused = reasons.Refused  # the engine's answer when nothing can take a request

DEFAULT_SHARES: Mapping[int, float] = MappingProxyType({1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15})
_MISSING: Any = object()
# one end group of a partition for one request shape: (packing.lease_bound, pattern rank, (signature, -allocations))
_Group = tuple[tuple[float, ...], tuple[float, ...], tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Request:
    allocation_id: str
    tenant: str
    sku: str
    gpu_count: int
    region: str
    vm_profile: str | None = None
    requested_at: float = 0.0  # seconds on any fixed scale; only the order matters
    # When the lease's reserved term ends, on requested_at's scale (Allocation.lease_hours after
    # requested_at); None for an on-demand lease that runs until released.
    ends_at: float | None = None
    # Nodes this request must not land on (where an earlier attempt of the allocation failed).
    avoid: frozenset[str] = frozenset()
    # sha256 of the image the allocation boots; among equally packed nodes one that caches it wins.
    image_digest: str | None = None


def lease_end(alloc: m.Allocation) -> float | None:
    """When an allocation's reserved term ends (seconds, `requested_at`'s scale); None when on-demand."""
    if alloc.lease_hours is None:
        return None
    return alloc.requested_at.timestamp() + alloc.lease_hours * packing.HOUR_S


def claim_order(c: plans.ExistingClaim) -> tuple[str, str, int]:
    """The order claims are loaded in (an allocation's first node by name is where it is held)."""
    return c.allocation_id, c.node, c.slot_index or -1


def _same_score(a: NodeKey, b: NodeKey) -> bool:
    """Equal placement keys but for the node order (always the last element)."""
    return a[:-1] == b[:-1]


class Tier(enum.Enum):
    """Which partitions of a (SKU, region) a tenant's request looks at."""

    OWN = "own"  # nodes dedicated to the tenant (Node.org = tenant)
    SHARED = "shared"  # nodes without an org
    ANY = "any"  # both: what explanations and capacity counts see

    def admits(self, org: str | None, tenant: str) -> bool:
        if self is Tier.OWN:
            return org is not None and org == tenant
        if self is Tier.SHARED:
            return org is None
        return org is None or org == tenant


_TIERS = (Tier.OWN, Tier.SHARED)


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    slot_indexes: tuple[int, ...]
    capacity_shape: m.CapacityShape
    profile: profiles.Profile | None
    alternatives: tuple[plans.Candidate, ...] = ()


@dataclass(frozen=True, slots=True)
class Spec:
    """A validated request shape (SKU, count, profile), cached per engine."""

    sku: m.Sku
    rule: m.TopologyRule
    profile: profiles.Profile | None


class _Node:
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
        self.facts = facts
        self.name = facts.name
        self.slot_indexes = tuple(s.index for s in facts.slots)
        self.all_mask = (1 << len(self.slot_indexes)) - 1
        self.allocs: dict[str, int] = {}  # allocation id -> claimed positions
        self.since: dict[str, float] = {}  # allocation id -> requested_at
        self.ends: dict[str, float] = {}  # allocation id -> lease end (packing.NO_END without a term)
        self.exclusive: str | None = None
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


class Engine:
    """Placement state of one fleet under one policy."""

    def __init__(
        self,
        desired: DesiredState,
        observed: plans.Observed | None = None,
        *,
        policy: str | None = None,
        shares: Mapping[int, float] | None = None,
    ) -> None:
        observed = observed or plans.Observed()
        fleet = desired.fleet
        name = policy or (fleet.placement.policy if fleet else packing.Policy.DEFAULT.value)
        try:
            self.policy = packing.Policy(name)
        except ValueError:
            known = ", ".join(p.value for p in packing.ALL)
            raise ValueError(f"unknown placement policy {name!r}; known: {known}") from None
        self._seed_rank = packing.slot_tiebreak(self.policy)
        self._by_end = packing.uses_lease_ends(self.policy)
        self._by_head = packing.interleaves(self.policy)
        self.lease_end_weight = (fleet.placement if fleet else m.PlacementSettings()).lease_end_weight
        if shares is None:
            shares = fleet.placement.workload_mix if fleet else DEFAULT_SHARES
        self.shares = dict(shares)
        self.skus = desired.skus
        self.warnings: list[str] = []
        facts = fleetgraph.inventory(desired, observed)
        self._facts: tuple[fleetgraph.NodeFacts, ...] | None = facts  # None: read again off the nodes (`facts`)
        self.nodes = [_Node(i, f) for i, f in enumerate(facts)]
        self.by_name = {n.name: n for n in self.nodes}
        self._requested = {a.id: a.requested_at.timestamp() for a in desired.allocations.values()}
        self._lease_ends = {a.id: end for a in desired.allocations.values() if (end := lease_end(a)) is not None}
        self.where: dict[str, _Node] = {}  # allocation id -> node
        # image digest -> ids of nodes whose host reported it cached (the warm-cache tie-break)
        self._warm: dict[str, frozenset[int]] = {}
        self.recache({}, observed.image_cache)
        # interning and memo tables
        self._layouts: list[t.Layout] = []
        self._layout_ids: dict[tuple[Any, ...], int] = {}
        self._raw_layouts: dict[tuple[Any, ...], int] = {}
        self._mixes: list[packing.Mix] = []
        self._mix_ids: dict[packing.Mix, int] = {}
        self._sig_of: dict[tuple[int, int], int] = {}
        self._sig_ids: dict[tuple[Any, ...], int] = {}
        self._ranks: dict[tuple[int, int, m.TopologyRule], dict[int, tuple[float, ...] | None]] = {}
        self._sorted_sigs: dict[
            tuple[SliceIndex, int, m.TopologyRule], tuple[int, list[tuple[tuple[float, ...], int]]]
        ] = {}
        self._sorted_ends: dict[tuple[SliceIndex, int, m.TopologyRule], tuple[int, list[_Group]]] = {}
        self._choices: dict[tuple[int, int, int, m.TopologyRule, int], t.Choice | None] = {}
        self._specs: dict[tuple[str, int, str | None], Spec | Refused] = {}
        self._static: dict[tuple[str, str, str], Refused | None] = {}
        # partitions
        self._slice_parts: dict[tuple[str, str, str | None, int], SliceIndex] = {}
        self._whole_parts: dict[tuple[str, str, str | None], WholeNodeIndex] = {}
        self._slice_lists_cache: dict[tuple[str, str, str, Tier], list[SliceIndex]] = {}
        self._whole_lists_cache: dict[tuple[str, str, str, Tier], list[WholeNodeIndex]] = {}
        self._tier = Tier.ANY  # which partitions a request sees; `place` narrows it (dedicated first)
        self.empty_nodes = 0
        self._build_views()
        self._load_claims(observed.claims)
        for node in self.nodes:
            if not node.allocs:
                self.empty_nodes += 1
            self._index(node)

    # ------------------------------------------------------------------ build

    def _layout_id(self, node: _Node, positions: list[int]) -> tuple[int, t.Layout]:
        slots = node.facts.slots
        raw = (tuple((p, slots[p].group, slots[p].pair) for p in positions), node.slot_indexes)
        lid = self._raw_layouts.get(raw)
        if lid is not None:
            return lid, self._layouts[lid]
        groups: dict[str, dict[str, list[int]]] = {}
        for p in positions:
            s = slots[p]
            unit = s.pair if s.pair is not None else f"\0{p}"
            groups.setdefault(s.group, {}).setdefault(unit, []).append(p)
        lay = t.layout(g.values() for g in groups.values())
        key = (lay.groups, node.slot_indexes)
        lid = self._layout_ids.get(key)
        if lid is None:
            lid = self._layout_ids[key] = len(self._layouts)
            self._layouts.append(lay)
        self._raw_layouts[raw] = lid
        return lid, self._layouts[lid]

    def _mix_id(self, mix: packing.Mix) -> int:
        mid = self._mix_ids.get(mix)
        if mid is None:
            mid = self._mix_ids[mix] = len(self._mixes)
            self._mixes.append(mix)
        return mid

    def _whole_skus(self, f: fleetgraph.NodeFacts) -> list[m.Sku]:
        sku = self.skus.get(f.baremetal_sku or "")
        if sku is None or sku.capacity_shape is not m.CapacityShape.BAREMETAL:
            return []
        if f.slots and not any(fabric.fabric_serves(sku.network_fabric, s.fabric) for s in f.slots):
            return []
        return [sku]

    def _build_views(self) -> None:
        self._slice_skus = sorted(
            (s for s in self.skus.values() if s.capacity_shape is m.CapacityShape.GPU_SLICE), key=lambda s: s.sku
        )
        self._mix_of: dict[tuple[str, bool], int] = {}
        for node in self.nodes:
            self._view_node(node)

    def _view_node(self, node: _Node) -> None:
        """Put one (unindexed) node into the partitions its facts serve."""
        f = node.facts
        if not f.active:
            return
        wholes = self._whole_skus(f)
        for sku in wholes:
            part = self._whole_parts.setdefault((sku.sku, f.region, f.org), WholeNodeIndex())
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
            view = self._slice_parts.get(key)
            if view is None:
                view = self._slice_parts[key] = SliceIndex(key[3], by_end=self._by_end, by_head=self._by_head)
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

    def _load_claim(self, node: _Node, c: plans.ExistingClaim) -> None:
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

    # ------------------------------------------- warm upkeep (reconciler.placement.replanning)
    #
    # An engine kept across revisions is brought to what a fresh one would hold
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
        self._unindex(node)
        self._drifted.clear()  # counts unclaimed slots: this node's claims change
        if not node.allocs:
            self.empty_nodes -= 1
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
            self.empty_nodes += 1
        self._index(node)
        return touched

    def _refact(self, node: _Node, facts: fleetgraph.NodeFacts) -> None:
        """Swap an unindexed, claimless node's facts and partitions (a new slot map, a drain, health)."""
        for w in node.wholes:
            w.members -= 1
        node.views, node.wholes = [], []
        node.facts = facts
        node.slot_indexes = tuple(s.index for s in facts.slots)
        node.all_mask = (1 << len(node.slot_indexes)) - 1
        node.whole_ok = facts.active and facts.cleanup_pending == 0 and facts.host_blocked == 0
        self._view_node(node)
        self._facts = None
        # what was read off the old facts: partition lists (a partition may be new) and static refusals
        self._slice_lists_cache.clear()
        self._whole_lists_cache.clear()
        self._static.clear()
        self._drifted.clear()

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
            ids = (self._warm.get(d, frozenset()) - gone.get(d, set())) | came.get(d, set())
            if ids:
                self._warm[d] = frozenset(ids)
            else:
                self._warm.pop(d, None)

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
            canon = t.signature(self._layouts[lid], mask)
            sig = self._sig_ids.setdefault(canon, len(self._sig_ids))
            self._sig_of[(lid, mask)] = sig
        return sig

    def _index(self, node: _Node) -> None:
        claimed = node.claimed
        key = packing.node_key(self.policy, node.id, len(node.allocs), min(node.since.values()) if node.since else 0.0)
        end = packing.node_end(node.ends.values()) if self._by_end else 0.0
        for part, lid, lay in node.views:
            free = lay.full & ~claimed
            part.add(node.id, self._sig(lid, free), (lid, free), free.bit_count(), key, end=end)
        if not node.allocs and node.whole_ok:
            wkey = packing.baremetal_key(self.policy, node.id, bool(node.views))
            for w in node.wholes:
                w.empty.add(node.id, wkey)

    def _unindex(self, node: _Node) -> None:
        for part, _, _ in node.views:
            part.remove(node.id)
        if not node.allocs:
            for w in node.wholes:
                w.empty.discard(node.id)

    def _claim(self, node: _Node, allocation_id: str, mask: int, *, exclusive: bool, since: float, end: float) -> None:
        self._unindex(node)
        if not node.allocs:
            self.empty_nodes -= 1
        node.allocs[allocation_id] = mask
        node.since[allocation_id] = since
        node.ends[allocation_id] = end
        if exclusive:
            node.exclusive = allocation_id
        self.where[allocation_id] = node
        self._index(node)

    def release(self, allocation_id: str) -> bool:
        """Free every slot the allocation holds (its cleanup is assumed done)."""
        node = self.where.pop(allocation_id, None)
        if node is None:
            return False
        self._drifted.clear()  # a freed slot may be one its host reports drifted
        self._unindex(node)
        del node.allocs[allocation_id]
        del node.since[allocation_id]
        del node.ends[allocation_id]
        if node.exclusive == allocation_id:
            node.exclusive = None
        if not node.allocs:
            self.empty_nodes += 1
        self._index(node)
        return True

    # ------------------------------------------------------------------ place

    def spec(self, sku_name: str, gpu_count: int, vm_profile: str | None = None) -> Spec | Refused:
        key = (sku_name, gpu_count, vm_profile)
        out = self._specs.get(key)
        if out is None:
            out = self._specs[key] = self._make_spec(sku_name, gpu_count, vm_profile)
        return out

    def _make_spec(self, sku_name: str, gpu_count: int, vm_profile: str | None) -> Spec | Refused:
        sku = self.skus.get(sku_name)
        if sku is None:
            return Refused(reasons.SKU_UNKNOWN, f"no SKU named {sku_name}")
        if not sku.active:
            return Refused(reasons.SKU_INACTIVE, f"SKU {sku_name} is not active")
        if gpu_count not in sku.counts:
            allowed = ", ".join(str(c) for c in sku.counts)
            return Refused(
                reasons.GPU_COUNT,
                f"SKU {sku_name} sells {allowed} GPU(s), not {gpu_count}",
                MappingProxyType({"allowed": sku.counts, "gpu_count": gpu_count}),
            )
        prof = profiles.resolve(sku, gpu_count, vm_profile)
        if isinstance(prof, profiles.ProfileError):
            return Refused(prof.code, prof.message)
        return Spec(sku, sku.topology_policy.rule(gpu_count), prof)

    def place(self, req: Request, *, alternatives: int = 0) -> Placed | Refused:
        """Choose and claim slots for one request; the claim stays until `release`."""
        spec = self.spec(req.sku, req.gpu_count, req.vm_profile)
        if isinstance(spec, Refused):
            return spec
        if req.allocation_id in self.where:
            node = self.where[req.allocation_id]
            return Placed(
                node.name, self._slots(node, node.allocs[req.allocation_id]), spec.sku.capacity_shape, spec.profile
            )
        whole = spec.sku.capacity_shape is m.CapacityShape.BAREMETAL
        hidden = [n for name in sorted(req.avoid) if (n := self.by_name.get(name)) is not None]
        for n in hidden:
            self._unindex(n)
        try:
            found = self._pick_tiered(req, spec.rule, whole, alternatives)
            if found is None:
                return self.explain(req)
        finally:
            for n in hidden:
                self._index(n)
        node, mask, alts = found
        self._claim(
            node,
            req.allocation_id,
            mask,
            exclusive=whole,
            since=req.requested_at,
            end=packing.NO_END if req.ends_at is None else req.ends_at,
        )
        return Placed(node.name, self._slots(node, mask), spec.sku.capacity_shape, spec.profile, alts)

    def _pick_tiered(
        self, req: Request, rule: m.TopologyRule, whole: bool, alternatives: int
    ) -> tuple[_Node, int, tuple[plans.Candidate, ...]] | None:
        """Dedicated nodes first: the tenant's own nodes (`org` = tenant), then shared ones (seed 002).

        The policy ranks only inside a tier; a shared node is taken only when no
        node of the tenant's own can take the request. Alternatives follow the
        same order (the rest of the winning tier, then the shared tier).
        """
        try:
            for i, tier in enumerate(_TIERS):
                self._tier = tier
                pick = self._pick_whole(req) if whole else self._pick_slice(req, rule)
                if pick is None:
                    continue
                alts: list[plans.Candidate] = []
                for later in _TIERS[i:]:
                    if len(alts) >= alternatives:
                        break
                    self._tier = later
                    seen = {c.node for c in alts}
                    alts += [c for c in self._alternatives(req, rule, pick[0], alternatives) if c.node not in seen][
                        : alternatives - len(alts)
                    ]
                return pick[0], pick[1], tuple(alts)
            return None
        finally:
            self._tier = Tier.ANY

    def _slots(self, node: _Node, mask: int) -> tuple[int, ...]:
        return tuple(node.slot_indexes[p] for p in t.positions(mask))

    def _slice_lists(self, sku: str, region: str, tenant: str) -> list[SliceIndex]:
        key = (sku, region, tenant, self._tier)
        parts = self._slice_lists_cache.get(key)
        if parts is None:
            parts = self._slice_lists_cache[key] = [
                p
                for (s, r, org, _), p in sorted(self._slice_parts.items(), key=lambda kv: kv[1].mix_id)
                if s == sku and r == region and self._tier.admits(org, tenant)
            ]
        return parts

    def _whole_lists(self, sku: str, region: str, tenant: str) -> list[WholeNodeIndex]:
        key = (sku, region, tenant, self._tier)
        parts = self._whole_lists_cache.get(key)
        if parts is None:
            parts = self._whole_lists_cache[key] = [
                p
                for (s, r, org), p in sorted(self._whole_parts.items(), key=lambda kv: str(kv[0]))
                if s == sku and r == region and self._tier.admits(org, tenant)
            ]
        return parts

    def _pick_whole(self, req: Request) -> tuple[_Node, int] | None:
        best: tuple[NodeKey, int] | None = None
        for part in self._whole_lists(req.sku, req.region, req.tenant):
            top = part.empty.peek()
            if top is not None and (best is None or top < best):
                best = top
        if best is None:
            return None
        if req.image_digest and best[1] not in self._warm.get(req.image_digest, ()):
            warm: tuple[NodeKey, int] | None = None
            for part in self._whole_lists(req.sku, req.region, req.tenant):
                for nid in self._warm_candidates(req.image_digest, part.empty):
                    key = part.empty.key_of(nid)
                    if key is not None and _same_score(key, best[0]) and (warm is None or key < warm[0]):
                        warm = (key, nid)
            best = warm or best
        node = self.nodes[best[1]]
        return node, node.all_mask

    _WARM_SCAN = 256  # above this many warm nodes, look only at the heads of the winning buckets

    def _warm_candidates(self, digest: str | None, heap: NodeHeap) -> Iterable[int]:
        """Nodes of `heap` that cache `digest`, the cheaper way round (few warm nodes, or the heap's heads)."""
        warm = self._warm.get(digest or "", frozenset())
        if not warm:
            return ()
        if len(warm) <= self._WARM_SCAN:
            return warm
        return [nid for _, nid in heap.smallest(self._WARM_SCAN // 8) if nid in warm]

    def _rank(self, part: SliceIndex, sig: int, g: int, rule: m.TopologyRule) -> tuple[float, ...] | None:
        lid, mask = next(iter(part.buckets[sig]))
        opt = packing.option(self.policy, self._layouts[lid], mask, g, rule, demands=self._mixes[part.mix_id])
        return None if opt is None else packing.rank(self.policy, opt)

    def _choice(self, lid: int, mask: int, g: int, rule: m.TopologyRule, mix_id: int) -> t.Choice:
        key = (lid, mask, g, rule, mix_id)
        if key in self._choices:
            c = self._choices[key]
        else:
            lay = self._layouts[lid]
            c = self._choices[key] = packing.in_node(
                self.policy, lay, mask, t.choices(lay, mask, g, rule), self._mixes[mix_id]
            )
        if c is None:
            raise AssertionError("a ranked signature always has a choice")
        return c

    def _pick_slice(self, req: Request, rule: m.TopologyRule) -> tuple[_Node, int] | None:
        if self._by_end and req.ends_at is not None:
            return self._pick_by_end(req, rule, req.ends_at)
        if self._by_head:
            return self._pick_interleaved(req, rule)
        tied = self._best_signatures(req, rule)
        if not tied:
            return None
        g = req.gpu_count
        best: tuple[NodeKey, SliceIndex, int, int, int] | None = None
        for part, sig in tied:
            for (lid, mask), heap in part.buckets[sig].items():
                top = heap.peek()
                if top is None:
                    continue
                key = top[0]
                if self._seed_rank:
                    first = self._choice(lid, mask, g, rule, part.mix_id).mask
                    key = (self.nodes[top[1]].slot_indexes[(first & -first).bit_length() - 1], *key)
                if best is None or key < best[0]:
                    best = (key, part, lid, mask, top[1])
        if best is None:
            return None
        if req.image_digest:
            best = self._warm_slice(req.image_digest, tied, g, rule, best)
        _, part, lid, mask, nid = best
        return self.nodes[nid], self._choice(lid, mask, g, rule, part.mix_id).mask

    def _warm_slice(
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
        if best[4] in self._warm.get(digest, ()):
            return best
        warm: tuple[NodeKey, SliceIndex, int, int, int] | None = None
        for part, sig in tied:
            for (lid, mask), heap in part.buckets[sig].items():
                for nid in self._warm_candidates(digest, heap):
                    key = heap.key_of(nid)
                    if key is None:
                        continue
                    if self._seed_rank:
                        first = self._choice(lid, mask, g, rule, part.mix_id).mask
                        key = (self.nodes[nid].slot_indexes[(first & -first).bit_length() - 1], *key)
                    if _same_score(key, best[0]) and (warm is None or key < warm[0]):
                        warm = (key, part, lid, mask, nid)
        return warm or best

    def _sorted_signatures(self, part: SliceIndex, g: int, rule: m.TopologyRule) -> list[tuple[tuple[float, ...], int]]:
        """The fitting free patterns present in one partition with their rank, best first.

        Cached until a pattern appears in or leaves the partition (`sig_version`).
        """
        ckey = (part, g, rule)
        cached = self._sorted_sigs.get(ckey)
        if cached is not None and cached[0] == part.sig_version:
            return cached[1]
        ranks = self._ranks.get((part.mix_id, g, rule))
        if ranks is None:
            ranks = self._ranks[(part.mix_id, g, rule)] = {}
        out = []
        for sig in part.sig_count:
            r = ranks.get(sig, _MISSING)
            if r is _MISSING:
                r = ranks[sig] = self._rank(part, sig, g, rule)
            if r is not None:
                out.append((r, sig))
        out.sort()
        self._sorted_sigs[ckey] = (part.sig_version, out)
        return out

    def _end_best(self, order: EndOrder, start: float, end: float, rank: tuple[float, ...]) -> tuple[NodeKey, int]:
        """The best node of one free pattern for a lease from `start` to `end`, with its full key.

        The first node that empties at or after `end` adds no delay and has
        the least slack: every other node of the pattern empties before `end`
        (or is empty, busy from `start`) and is delayed. Without one, the node
        that empties last before `end` or an empty node, whichever is delayed less.
        """
        weight = self.lease_end_weight
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

    def _pick_by_end(self, req: Request, rule: m.TopologyRule, end: float) -> tuple[_Node, int] | None:
        """`default` for a lease with a known end: fragmentation gradient plus the delay it adds.

        No warm-cache tie-break here: the key carries the lease-end delay, so
        two candidates are almost never equal, and the image must not outweigh it.
        """
        g, start = req.gpu_count, req.requested_at
        best: tuple[NodeKey, SliceIndex, int] | None = None
        for part in self._slice_lists(req.sku, req.region, req.tenant):
            ends = part.ends
            if ends is None:
                raise AssertionError("a policy that ranks by lease ends indexes them")
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
        return self.nodes[nid], self._choice(lid, mask, g, rule, part.mix_id).mask

    def _sorted_groups(self, part: SliceIndex, g: int, rule: m.TopologyRule) -> list[_Group]:
        """The fitting end groups (pattern, allocation count) of one partition, by `packing.lease_bound`.

        Cached until a group appears in or leaves the partition (`end_version`).
        """
        ckey = (part, g, rule)
        cached = self._sorted_ends.get(ckey)
        if cached is not None and cached[0] == part.end_version:
            return cached[1]
        ends = part.ends
        if ends is None:
            raise AssertionError("a policy that ranks by lease ends indexes them")
        ranks = self._ranks.setdefault((part.mix_id, g, rule), {})
        out = []
        for group in ends:
            sig = group[0]
            r = ranks.get(sig, _MISSING)
            if r is _MISSING:
                r = ranks[sig] = self._rank(part, sig, g, rule)
            if r is not None:
                out.append((packing.lease_bound(r, group[1]), r, group))
        out.sort()
        self._sorted_ends[ckey] = (part.end_version, out)
        return out

    def _pick_interleaved(self, req: Request, rule: m.TopologyRule) -> tuple[_Node, int] | None:
        """`default` for a lease without an end: the head of every fitting pattern, by `packing.place_key`.

        Patterns come in rank order, so the first part of the key they fix
        (`packing.place_bound`) never decreases: stop once it is worse than the best.
        """
        g = req.gpu_count
        best: tuple[NodeKey, SliceIndex, int] | None = None
        for part in self._slice_lists(req.sku, req.region, req.tenant):
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
        if req.image_digest and best[2] not in self._warm.get(req.image_digest, ()):
            best = self._warm_interleaved(req, rule, best)
        _, part, nid = best
        lid, mask = part.place[nid][1]
        return self.nodes[nid], self._choice(lid, mask, g, rule, part.mix_id).mask

    def _warm_interleaved(
        self, req: Request, rule: m.TopologyRule, best: tuple[NodeKey, SliceIndex, int]
    ) -> tuple[NodeKey, SliceIndex, int]:
        """Among nodes with `best`'s key but for the node order, the first that caches the image (else `best`)."""
        warm: tuple[NodeKey, SliceIndex, int] | None = None
        for part in self._slice_lists(req.sku, req.region, req.tenant):
            heads = part.heads or {}
            for rank, sig in self._sorted_signatures(part, req.gpu_count, rule):
                heap = heads[sig]
                for nid in self._warm_candidates(req.image_digest, heap):
                    node_key = heap.key_of(nid)
                    if node_key is None:
                        continue
                    key = packing.place_key(rank, node_key)
                    if _same_score(key, best[0]) and (warm is None or key < warm[0]):
                        warm = (key, part, nid)
        return warm or best

    def _alternatives_interleaved(
        self, req: Request, rule: m.TopologyRule, chosen: _Node, count: int
    ) -> tuple[plans.Candidate, ...]:
        """Next-best nodes under `packing.place_key`: the first few of every fitting pattern's heads."""
        g = req.gpu_count
        found: dict[int, tuple[NodeKey, tuple[int, ...]]] = {}
        for part in self._slice_lists(req.sku, req.region, req.tenant):
            heads = part.heads or {}
            for rank, sig in self._sorted_signatures(part, g, rule):
                for node_key, nid in heads[sig].smallest(count + 1):
                    if nid == chosen.id or nid in found:
                        continue
                    lid, mask = part.place[nid][1]
                    taken = self._choice(lid, mask, g, rule, part.mix_id).mask
                    found[nid] = (packing.place_key(rank, node_key), self._slots(self.nodes[nid], taken))
        best = sorted((key, nid, slots) for nid, (key, slots) in found.items())[:count]
        return tuple(plans.Candidate(self.nodes[nid].name, slots) for _, nid, slots in best)

    def _best_signatures(self, req: Request, rule: m.TopologyRule) -> list[tuple[SliceIndex, int]]:
        """The free patterns, across the request's partitions, that the policy ranks first."""
        g = req.gpu_count
        best_rank: tuple[float, ...] | None = None
        tied: list[tuple[SliceIndex, int]] = []
        for part in self._slice_lists(req.sku, req.region, req.tenant):
            rkey = (part.mix_id, g, rule)
            ranks = self._ranks.get(rkey)
            if ranks is None:
                ranks = self._ranks[rkey] = {}
            for sig in part.sig_count:
                r = ranks.get(sig, _MISSING)
                if r is _MISSING:
                    r = ranks[sig] = self._rank(part, sig, g, rule)
                if r is None:
                    continue
                if best_rank is None or r < best_rank:
                    best_rank = r
                    tied = [(part, sig)]
                elif r == best_rank:
                    tied.append((part, sig))
        return tied

    def _alternatives(
        self, req: Request, rule: m.TopologyRule, chosen: _Node, count: int
    ) -> tuple[plans.Candidate, ...]:
        """Next-best nodes for apply to try after a lost race, in the policy's order.

        Read-only: walks the heads of the ranked buckets without moving a node.
        """
        if self.skus[req.sku].capacity_shape is m.CapacityShape.BAREMETAL:
            heads = sorted(
                h
                for part in self._whole_lists(req.sku, req.region, req.tenant)
                for h in part.empty.smallest(count + 1)
                if h[1] != chosen.id
            )
            return tuple(plans.Candidate(self.nodes[nid].name, ()) for _, nid in heads[:count])
        if self._by_end and req.ends_at is not None:
            return self._alternatives_by_end(req, rule, chosen, count, req.ends_at)
        if self._by_head:
            return self._alternatives_interleaved(req, rule, chosen, count)
        out: list[plans.Candidate] = []
        for group in self._ranked_groups(req, rule):
            found = sorted(
                h
                for part, sig in group
                for h in self._heads(part, sig, req.gpu_count, rule, count + 1)
                if h[1] != chosen.id
            )
            for _, nid, slots in found:
                out.append(plans.Candidate(self.nodes[nid].name, slots))
                if len(out) == count:
                    return tuple(out)
        return tuple(out)

    def _alternatives_by_end(
        self, req: Request, rule: m.TopologyRule, chosen: _Node, count: int, end: float
    ) -> tuple[plans.Candidate, ...]:
        """Next-best nodes under the lease-end key: the nodes around `end` in every fitting bucket."""
        g, start, weight = req.gpu_count, req.requested_at, self.lease_end_weight
        found: dict[int, tuple[NodeKey, tuple[int, ...]]] = {}
        for part in self._slice_lists(req.sku, req.region, req.tenant):
            ends = part.ends
            if ends is None:
                raise AssertionError("a policy that ranks by lease ends indexes them")
            for _, rank, group in self._sorted_groups(part, g, rule):
                for node_end, key, nid in ends[group].around(end, count + 1):
                    if nid == chosen.id or nid in found:
                        continue
                    lid, mask = part.place[nid][1]
                    taken = self._choice(lid, mask, g, rule, part.mix_id).mask
                    full = packing.lease_key(packing.lease_rank(rank, node_end, start, end, weight), key)
                    found[nid] = (full, self._slots(self.nodes[nid], taken))
        best = sorted((key, nid, slots) for nid, (key, slots) in found.items())[:count]
        return tuple(plans.Candidate(self.nodes[nid].name, slots) for _, nid, slots in best)

    def _ranked_groups(self, req: Request, rule: m.TopologyRule) -> list[list[tuple[SliceIndex, int]]]:
        """Every fitting free pattern of the request's partitions, grouped by rank, best first."""
        g = req.gpu_count
        groups: dict[tuple[float, ...], list[tuple[SliceIndex, int]]] = {}
        for part in self._slice_lists(req.sku, req.region, req.tenant):
            ranks = self._ranks.setdefault((part.mix_id, g, rule), {})
            for sig in part.sig_count:
                r = ranks.get(sig, _MISSING)
                if r is _MISSING:
                    r = ranks[sig] = self._rank(part, sig, g, rule)
                if r is not None:
                    groups.setdefault(r, []).append((part, sig))
        return [groups[r] for r in sorted(groups)]

    def _heads(
        self, part: SliceIndex, sig: int, g: int, rule: m.TopologyRule, count: int
    ) -> list[tuple[NodeKey, int, tuple[int, ...]]]:
        """The first `count` nodes of every bucket of one pattern, with the slots each would take."""
        out = []
        for (lid, mask), heap in part.buckets[sig].items():
            taken = self._choice(lid, mask, g, rule, part.mix_id).mask
            for key, nid in heap.smallest(count):
                node = self.nodes[nid]
                first: NodeKey = (node.slot_indexes[(taken & -taken).bit_length() - 1],) if self._seed_rank else ()
                out.append(((*first, *key), nid, self._slots(node, taken)))
        return out

    # ---------------------------------------------------------------- reasons

    def launchable(
        self, sku_name: str, region: str, g: int, *, tenant: str = "", limit: int
    ) -> tuple[int, Refused | None]:
        """How many g-GPU requests of a slice SKU fit one after the other, and why the next one would not.

        The answer of placing probes until one is refused (`capacity.fill`),
        without moving a node: a slice request changes only the node it lands
        on, and on a node the engine always takes `_choice` of its free mask,
        so each node's share is its own choice sequence, memoised per free
        pattern. The refusal is `explain` of the state those probes would
        leave. At 10,000 nodes this is what made a PR plan take 20 s.
        """
        spec = self.spec(sku_name, g)
        if isinstance(spec, Refused):
            return 0, spec
        if spec.sku.capacity_shape is m.CapacityShape.BAREMETAL:
            raise ValueError(f"{sku_name} is leased whole: count empty nodes instead")
        total = free = with_free = nodes = 0
        for part in self._slice_lists(sku_name, region, tenant):
            nodes += len(part)
            for _, (lid, mask), _ in part.place.values():
                n, rest = self._fill_node(lid, mask, g, spec.rule, part.mix_id)
                total += n
                left = rest.bit_count()
                free += left
                with_free += left > 0
        if total >= limit:
            return limit, None
        return total, self._refusal(Request("", tenant, sku_name, g, region), spec, (free, with_free, nodes))

    def whole_launchable(
        self, sku_name: str, region: str, g: int, *, tenant: str = "", limit: int
    ) -> tuple[int, Refused | None]:
        """How many fresh whole-node requests of a baremetal SKU fit one after the other, and why the next not.

        The answer of placing probes (new allocation ids, no `avoid`) until one
        is refused, without moving a node. A whole-node request takes the head
        of an empty-node heap of its (SKU, region, org) partitions, own tier
        then shared; those tiers together are exactly the partitions `Tier.ANY`
        admits, a node sits in at most one whole partition, and a claim only
        takes a node out of the heaps (nothing comes back while probes are
        held): so each probe removes one node, and the probes stop when every
        admitted heap is empty. The refusal then is `explain`, which for a
        baremetal SKU reads only facts and partition sizes, never claims.
        """
        if limit <= 0:
            return 0, None  # probing stops before the first request
        spec = self.spec(sku_name, g)
        if isinstance(spec, Refused):
            return 0, spec
        if spec.sku.capacity_shape is not m.CapacityShape.BAREMETAL:
            raise ValueError(f"{sku_name} is sold in slices: use launchable")
        empty = sum(len(p.empty) for p in self._whole_lists(sku_name, region, tenant))
        if empty >= limit:
            return limit, None
        return empty, self._refusal(Request("", tenant, sku_name, g, region), spec)

    @functools.cached_property
    def _fills(self) -> dict[tuple[int, int, int, m.TopologyRule, int], tuple[int, int]]:
        return {}  # (layout, free mask, g, rule, mix) -> what `_fill_node` found: patterns repeat fleet-wide

    def _fill_node(self, lid: int, mask: int, g: int, rule: m.TopologyRule, mix_id: int) -> tuple[int, int]:
        """(requests of g GPUs the free `mask` takes one after the other, the mask left), memoised."""
        key = (lid, mask, g, rule, mix_id)
        found = self._fills.get(key)
        if found is None:
            lay = self._layouts[lid]
            n, rest = 0, mask
            while True:
                c = packing.in_node(self.policy, lay, rest, t.choices(lay, rest, g, rule), self._mixes[mix_id])
                if c is None:
                    break
                n, rest = n + 1, rest & ~c.mask
            found = self._fills[key] = (n, rest)
        return found

    def explain(self, req: Request) -> Refused:
        """Why nothing can take this request now, most fundamental reason first."""
        spec = self.spec(req.sku, req.gpu_count, req.vm_profile)
        if isinstance(spec, Refused):
            return spec
        return self._refusal(req, spec)

    def _refusal(self, req: Request, spec: Spec, counts: tuple[int, int, int] | None = None) -> Refused:
        """`explain` for a valid spec; `counts` (free GPUs, nodes with free, nodes) replace the partitions' own."""
        key = (req.sku, req.region, req.tenant)
        static = self._static.get(key, _MISSING)
        if static is _MISSING:
            static = self._static[key] = reasons.static_refusal(self.facts, spec.sku, req.region, req.tenant)
        if static is not None:
            return static  # type: ignore[no-any-return]
        sku, g = spec.sku, req.gpu_count
        if sku.capacity_shape is m.CapacityShape.BAREMETAL:
            members = sum(p.members for p in self._whole_lists(req.sku, req.region, req.tenant))
            return Refused(
                reasons.NO_EMPTY_NODE,
                f"all {members} node(s) that lease {sku.sku} in {req.region} hold claims or wait "
                "for cleanup proof; a baremetal lease needs a node with no claim at all",
                MappingProxyType({"candidate_nodes": members}),
            )
        if counts is None:
            parts = self._slice_lists(req.sku, req.region, req.tenant)
            counts = (
                sum(p.free_gpus for p in parts),
                sum(p.nodes_with_free for p in parts),
                sum(len(p) for p in parts),
            )
        free, with_free, nodes = counts
        drifted = self._drifted_slots(sku, req.region, req.tenant)
        details = MappingProxyType(
            {
                "free_gpus": free,
                "nodes_with_free": with_free,
                "candidate_nodes": nodes,
                "gpu_count": g,
                "rule": spec.rule.value,
                "host_drift_slots": drifted,
            }
        )
        if drifted and free < g:
            return Refused(
                reasons.CAPACITY,
                f"only {free} free GPU(s) on {with_free} node(s) serve {sku.sku} in {req.region}; "
                f"{g} requested ({drifted} more slot(s) wait for their hosts to report them clear "
                "of drift)",
                details,
            )
        if free >= g:
            return Refused(
                reasons.TOPOLOGY,
                f"{free} free GPU(s) on {with_free} node(s) serve {sku.sku} in {req.region}, but no "
                f"node has a topology-safe set of {g} ({spec.rule.value})",
                details,
            )
        return Refused(
            reasons.CAPACITY,
            f"only {free} free GPU(s) on {with_free} node(s) serve {sku.sku} in {req.region}; {g} requested",
            details,
        )

    @functools.cached_property
    def _drifted(self) -> dict[tuple[str, str, str], int]:
        return {}  # (sku, region, tenant) -> free slots their hosts report drifted (`_drifted_slots`)

    def _drifted_slots(self, sku: m.Sku, region: str, tenant: str) -> int:
        """Unclaimed, otherwise sellable slots of the SKU's GPU in the region that their hosts report drifted."""
        key = (sku.sku, region, tenant)
        found = self._drifted.get(key)
        if found is None:
            found = 0
            for node in self.nodes:
                f = node.facts
                if f.region != region or not f.host_blocked or not Tier.ANY.admits(f.org, tenant):
                    continue
                claimed = node.claimed
                found += sum(
                    1
                    for p, s in enumerate(f.slots)
                    if s.host_blocked
                    and not s.ineligible
                    and s.gpu_model == sku.accelerator_model
                    and s.status is states.SlotStatus.AVAILABLE
                    and not claimed >> p & 1
                )
            self._drifted[key] = found
        return found

    # ----------------------------------------------------------------- status

    def mode_facts(self, name: str) -> modes.ModeFacts:
        """The facts `policies.modes` derives a node's mode from, as of now."""
        node = self.by_name[name]
        f = node.facts
        claimed = node.claimed
        slot_claims = 0 if node.exclusive else claimed.bit_count()
        sellable = sum(1 for p, s in enumerate(f.slots) if s.sellable and not claimed >> p & 1)
        return modes.ModeFacts(
            capability=f.capability.capability,
            admin_state=f.admin_state,
            healthy=f.healthy,
            storage_mode=f.storage_mode,
            slot_claims=slot_claims,
            exclusive_claim=node.exclusive is not None,
            cleanup_slots=sum(1 for s in f.slots if s.status is states.SlotStatus.CLEANUP),
            blocked_slots=sum(1 for s in f.slots if s.status is states.SlotStatus.CLEANUP_BLOCKED),
            free_slots=0 if node.exclusive else sellable,
            node_corrupt=bool(f.corrupt),
        )

    def mode(self, name: str) -> modes.Mode:
        return modes.mode(self.mode_facts(name))

    def slice_parts(self, sku: str) -> list[SliceIndex]:
        """Every partition of one slice SKU (any region, any org)."""
        return [p for (s, _, _, _), p in self._slice_parts.items() if s == sku]

    def free_gpus(self, sku: str, region: str, tenant: str = "") -> int:
        return sum(p.free_gpus for p in self._slice_lists(sku, region, tenant))
