"""The capacity read model: what can be launched now, per region x SKU, and why not more.

Seed 000 ("Marketplace Capacity Accounting", "Capacity Read Models"): users
see product availability, not raw slot internals, and a launchable count may
be lower than the raw free slots. Here:

- `launchable` for each allowed GPU count of a SKU is how many more requests
  of exactly that size the planner's own engine would place, one after the
  other, on the current claims (then forgotten: nothing is claimed). Sizes of
  one SKU, and slice versus baremetal SKUs on the same hosts, compete for the
  same GPUs: the counts are alternatives, never to be added up;
- every free (unclaimed) slot that cannot carry the SKU gets exactly one
  reason (`Blocked`): cleanup, draining, fabric, tenant boundary, ...; free
  usable GPUs that a size still cannot use are `stranded_gpus` of that size
  (topology: no safe set of that many on one node);
- baremetal SKUs count whole nodes, with the same kind of reasons (a node
  with any slice claim is not baremetal-free: `slice_active`);
- node summaries carry capability, the derived mode, slots by status, the
  live allocations and, for a draining node, whether it is drained yet.

Pure: desired state and observed facts in, plain values out.
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from desired import models as m
from desired.state import DesiredState
from policies import fabric
from reconciler import plans
from reconciler.placement import fleetgraph, placing
from schemas import states

PROBE_PREFIX = "capacity-probe-"
# Stop counting after this many placements of one size (a 10,000-node fleet has 80,000 GPUs).
DEFAULT_LIMIT = 100_000


class Blocked(enum.StrEnum):
    """Why a free slot (or an unleased node) cannot be launched now. Stable values."""

    CLEANUP = "cleanup"  # released, waiting for the wipe proof
    CLEANUP_BLOCKED = "cleanup_blocked"  # the wipe failed; blocked until repair
    FAILED = "failed"
    DISABLED = "disabled"
    QUARANTINED = "quarantined"  # a permanent provision failure; an operator clears it
    INELIGIBLE = "ineligible"  # slot metadata incomplete (policies.eligibility)
    UNHEALTHY = "unhealthy"
    MAINTENANCE = "maintenance"
    DRAINING = "draining"
    NOT_SLICE_READY = "not_slice_ready"  # tag, firmware readiness or slot approval missing
    FABRIC = "fabric"  # the slot's fabric does not carry the SKU's promise
    PINNED = "pinned_to_other_sku"
    TENANT_BOUNDARY = "tenant_boundary"  # node dedicated to an organisation
    SLICE_ACTIVE = "slice_active"  # baremetal: slice claims live on the node
    HOST_DRIFT = "host_drift"  # its host reports the slot drifted or unschedulable (policies.hostreports)
    NODE_CORRUPT = "node_corrupt"  # its host reports node-wide corruption
    OTHER = "other"


_SLOT_STATUS_REASON = {
    states.SlotStatus.CLEANUP: Blocked.CLEANUP,
    states.SlotStatus.RELEASING: Blocked.CLEANUP,
    states.SlotStatus.CLEANUP_BLOCKED: Blocked.CLEANUP_BLOCKED,
    states.SlotStatus.FAILED: Blocked.FAILED,
    states.SlotStatus.DISABLED: Blocked.DISABLED,
    states.SlotStatus.QUARANTINED: Blocked.QUARANTINED,
}


def _empty() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Size:
    gpu_count: int
    launchable: int  # more requests of exactly this size that fit now
    stranded_gpus: int = 0  # usable free GPUs this size cannot use (topology)
    limit_code: str | None = None  # why not one more (the planner's reason code)
    limit_message: str | None = None


@dataclass(frozen=True, slots=True)
class Offer:
    """One product in one region: slots (gpu_slice) or nodes (baremetal)."""

    region: str
    sku: str
    capacity_shape: str
    unit: str  # "slot" | "node"
    total: int  # units of this product declared in the region
    in_use: int  # held by a live claim
    free: int  # not held (total - in_use)
    usable: int  # free and launchable for a tenant without a dedicated node
    not_launchable: Mapping[str, int] = field(default_factory=_empty)  # Blocked value -> units
    sizes: tuple[Size, ...] = ()
    dedicated: Mapping[str, tuple[Size, ...]] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class NodeSummary:
    name: str
    region: str
    pool: str
    org: str | None
    admin_state: str
    healthy: bool
    capability: str
    capability_reasons: tuple[str, ...]
    mode: str
    slots: Mapping[str, int]  # slot status (or "ineligible") -> count
    allocations: tuple[str, ...]  # allocations holding live claims here
    drained: bool  # draining or maintenance, and nothing left on it (no claim, no cleanup)
    corrupt: tuple[str, ...] = ()  # host evidence of node-wide corruption: takes nothing new
    drifted: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (slot, codes) its host reports blocking drift on


@dataclass(frozen=True, slots=True)
class ReadModel:
    offers: tuple[Offer, ...] = ()
    nodes: tuple[NodeSummary, ...] = ()

    def launchable(self) -> dict[tuple[str, str, int], int]:
        """(region, sku, gpu_count) -> launchable, for comparisons (PR plans)."""
        return {(o.region, o.sku, s.gpu_count): s.launchable for o in self.offers for s in o.sizes}


_SliceCounts = tuple[int, int, tuple[tuple[str, int], ...]]  # slots, in use, (Blocked value, slots)


@dataclass
class Memo:
    """Per-node parts of one read model, reused by the next one over nearly the same fleet.

    A PR plan reads base, then head: a few nodes differ. A part is reused
    only when its inputs are the very same objects (node facts, SKU; the
    engine and the blob cache hand out the same object for an unchanged
    node) and equal claims and mode. Entries hold those objects, so an
    identity is never confused with a new object's.
    """

    summaries: dict[str, tuple[fleetgraph.NodeFacts, tuple[plans.ExistingClaim, ...], str, NodeSummary]] = field(
        default_factory=dict
    )
    slices: dict[tuple[str, str], tuple[m.Sku, fleetgraph.NodeFacts, tuple[plans.ExistingClaim, ...], _SliceCounts]] = (
        field(default_factory=dict)
    )
    # (baremetal SKU, node) -> inputs and the node's part of the offer: in use (True) or why it is not usable
    wholes: dict[
        tuple[str, str], tuple[m.Sku, fleetgraph.NodeFacts, tuple[plans.ExistingClaim, ...], bool, Blocked | None]
    ] = field(default_factory=dict)


def read_model(
    desired: DesiredState,
    observed: plans.Observed,
    *,
    policy: str | None = None,
    limit: int = DEFAULT_LIMIT,
    engine: placing.Engine | None = None,
    memo: Memo | None = None,
    summaries: bool = True,
) -> ReadModel:
    """Launchable capacity and node summaries; `engine`, if given, is one built from the same inputs
    and holding no placement of its own (it is left as it was found). `memo` carries per-node parts
    from one call to the next (it gives the same answer as without it). `summaries=False`: the
    offers alone, no node summaries (a PR plan compares launchable counts and shows no node list)."""
    engine = engine or placing.Engine(desired, observed, policy=policy)
    memo = memo if memo is not None else Memo()
    by_node: dict[str, list[plans.ExistingClaim]] = defaultdict(list)
    for c in observed.claims:
        by_node[c.node].append(c)
    nodes = tuple(_summary(memo, engine, f, tuple(by_node.get(f.name, ()))) for f in engine.facts) if summaries else ()
    offers: list[Offer] = []
    regions = sorted({f.region for f in engine.facts})
    for sku in sorted(desired.skus.values(), key=lambda s: s.sku):
        if not sku.active:
            continue
        for region in regions:
            facts = [f for f in engine.facts if f.region == region]
            if sku.capacity_shape is m.CapacityShape.BAREMETAL:
                offer = _baremetal_offer(engine, sku, region, facts, by_node=by_node, limit=limit, memo=memo)
            else:
                offer = _slice_offer(engine, sku, region, facts, by_node=by_node, limit=limit, memo=memo)
            if offer is not None:
                offers.append(offer)
    return ReadModel(tuple(offers), nodes)


# ------------------------------------------------------------------- sizes


def fill(
    engine: placing.Engine, sku: str, region: str, gpu_count: int, *, tenant: str = "", limit: int = DEFAULT_LIMIT
) -> tuple[int, placing.Refused | None]:
    """How many requests of one size fit one after the other, and the refusal of the next one.

    Slice SKUs are counted per node pattern (`Engine.launchable`), whole-node
    SKUs by their empty nodes (`Engine.whole_launchable`): the same answers
    without moving a node. Anything else (an unknown SKU) places probes.
    """
    offered = engine.skus.get(sku)
    if offered is not None and offered.capacity_shape is m.CapacityShape.GPU_SLICE:
        return engine.launchable(sku, region, gpu_count, tenant=tenant, limit=limit)
    if offered is not None and offered.capacity_shape is m.CapacityShape.BAREMETAL:
        n, refusal = engine.whole_launchable(sku, region, gpu_count, tenant=tenant, limit=limit)
        if not _probe_held(engine, n):
            return n, refusal
    return probe_fill(engine, sku, region, gpu_count, tenant=tenant, limit=limit)


def _probe_held(engine: placing.Engine, n: int) -> bool:
    """Whether an allocation already holds one of the first n + 1 probe ids.

    `Engine.place` answers a held id with its present placement instead of
    placing it, so such probes would count differently: then only probing
    itself gives probing's answer.
    """
    if len(engine.where) <= n:  # fewer allocations than probes: look at the allocations
        return any(a.startswith(PROBE_PREFIX) for a in engine.where)
    return any(f"{PROBE_PREFIX}{i}" in engine.where for i in range(n + 1))


def probe_fill(
    engine: placing.Engine, sku: str, region: str, gpu_count: int, *, tenant: str = "", limit: int = DEFAULT_LIMIT
) -> tuple[int, placing.Refused | None]:
    """Place probe requests of one size until refused; forget them; return the count and the refusal."""
    placed: list[str] = []
    refusal: placing.Refused | None = None
    try:
        while len(placed) < limit:
            probe = f"{PROBE_PREFIX}{len(placed)}"
            out = engine.place(placing.Request(probe, tenant, sku, gpu_count, region))
            if isinstance(out, placing.Refused):
                refusal = out
                break
            placed.append(probe)
    finally:
        for probe in placed:
            engine.release(probe)
    return len(placed), refusal


def _sizes(
    engine: placing.Engine, sku: m.Sku, region: str, *, usable: int, tenant: str, limit: int
) -> tuple[Size, ...]:
    out = []
    slice_sku = sku.capacity_shape is m.CapacityShape.GPU_SLICE
    for g in sku.counts:
        n, refusal = fill(engine, sku.sku, region, g, tenant=tenant, limit=limit)
        stranded = max(0, usable - n * g) if slice_sku else 0
        out.append(Size(g, n, stranded, refusal.code if refusal else None, refusal.message if refusal else None))
    return tuple(out)


def _dedicated(
    engine: placing.Engine, sku: m.Sku, region: str, facts: list[fleetgraph.NodeFacts], limit: int
) -> Mapping[str, tuple[Size, ...]]:
    orgs = sorted({f.org for f in facts if f.org})
    out = {}
    for org in orgs:
        usable = engine.free_gpus(sku.sku, region, org)
        out[org] = _sizes(engine, sku, region, usable=usable, tenant=org, limit=limit)
    return MappingProxyType(out)


# ------------------------------------------------------------------- slices


def _node_reason(f: fleetgraph.NodeFacts) -> Blocked | None:
    if not f.healthy:
        return Blocked.UNHEALTHY
    if f.corrupt:
        return Blocked.NODE_CORRUPT
    if f.admin_state is m.AdminState.MAINTENANCE:
        return Blocked.MAINTENANCE
    if f.admin_state is m.AdminState.DRAINING:
        return Blocked.DRAINING
    return None


def _slot_reason(sku: m.Sku, f: fleetgraph.NodeFacts, s: fleetgraph.SlotFacts) -> Blocked | None:
    """The first reason, in this order: slot state, slot metadata, node, capability, fabric, tenant."""
    mismatch = fabric.mismatch(sku, s.gpu_model, s.fabric, s.pinned_sku)
    checks = (
        _SLOT_STATUS_REASON.get(s.status),
        Blocked.INELIGIBLE if s.ineligible else None,
        _node_reason(f),
        Blocked.HOST_DRIFT if s.host_blocked else None,
        None if f.slice_capable else Blocked.NOT_SLICE_READY,
        None if mismatch is None else Blocked.PINNED if mismatch.code == fabric.SKU_PINNED else Blocked.FABRIC,
        Blocked.TENANT_BOUNDARY if f.org else None,
    )
    return next((c for c in checks if c is not None), None)


def _slice_offer(
    engine: placing.Engine,
    sku: m.Sku,
    region: str,
    facts: list[fleetgraph.NodeFacts],
    *,
    by_node: Mapping[str, list[plans.ExistingClaim]],
    limit: int,
    memo: Memo,
) -> Offer | None:
    total = in_use = 0
    blocked: Counter[str] = Counter()
    serving = []
    for f in facts:
        claims = tuple(by_node.get(f.name, ()))
        hit = memo.slices.get((sku.sku, f.name))
        if hit is not None and hit[0] is sku and hit[1] is f and hit[2] == claims:
            counts = hit[3]
        else:
            counts = _slice_counts(sku, f, claims)
            memo.slices[sku.sku, f.name] = (sku, f, claims, counts)
        node_total, node_in_use, node_blocked = counts
        if not node_total:
            continue
        serving.append(f)
        total += node_total
        in_use += node_in_use
        for reason, n in node_blocked:
            blocked[reason] += n
    if not total:
        return None
    usable = engine.free_gpus(sku.sku, region)
    accounted = total - in_use - sum(blocked.values())
    if accounted != usable:  # a rule only the engine knows; keep the totals honest
        blocked[Blocked.OTHER.value] += accounted - usable
    sizes = _sizes(engine, sku, region, usable=usable, tenant="", limit=limit)
    return Offer(
        region,
        sku.sku,
        sku.capacity_shape.value,
        "slot",
        total,
        in_use,
        total - in_use,
        usable,
        MappingProxyType(dict(sorted(blocked.items()))),
        sizes,
        _dedicated(engine, sku, region, serving, limit),
    )


def _slice_counts(sku: m.Sku, f: fleetgraph.NodeFacts, claims: tuple[plans.ExistingClaim, ...]) -> _SliceCounts:
    """One node's slots of the SKU's GPU model: how many, how many in use, and why the free ones are blocked."""
    total = in_use = 0
    blocked: Counter[str] = Counter()
    held = _held_slots(f, claims)
    for s in f.slots:
        if s.gpu_model != sku.accelerator_model:
            continue
        total += 1
        if s.index in held and s.status not in _SLOT_STATUS_REASON:
            in_use += 1
            continue
        reason = _slot_reason(sku, f, s)
        if reason is not None:
            blocked[reason.value] += 1
    return total, in_use, tuple(blocked.items())


def _held_slots(f: fleetgraph.NodeFacts, claims: Sequence[plans.ExistingClaim]) -> set[int]:
    if any(c.kind is states.ClaimKind.NODE_EXCLUSIVE for c in claims):
        return {s.index for s in f.slots}
    return {c.slot_index for c in claims if c.slot_index is not None}


# ---------------------------------------------------------------- baremetal


def _baremetal_offer(
    engine: placing.Engine,
    sku: m.Sku,
    region: str,
    facts: list[fleetgraph.NodeFacts],
    *,
    by_node: Mapping[str, list[plans.ExistingClaim]],
    limit: int,
    memo: Memo,
) -> Offer | None:
    serving = [f for f in facts if f.baremetal_sku == sku.sku]
    if not serving:
        return None
    in_use = 0
    blocked: Counter[str] = Counter()
    for f in serving:
        claims = tuple(by_node.get(f.name, ()))
        hit = memo.wholes.get((sku.sku, f.name))
        if hit is not None and hit[0] is sku and hit[1] is f and hit[2] == claims:
            held, reason = hit[3], hit[4]
        else:
            held = any(c.kind is states.ClaimKind.NODE_EXCLUSIVE for c in claims)
            reason = None if held else _whole_reason(sku, f, claims)
            memo.wholes[sku.sku, f.name] = (sku, f, claims, held, reason)
        if held:
            in_use += 1
        elif reason is not None:
            blocked[reason.value] += 1
    usable = len(serving) - in_use - sum(blocked.values())
    sizes = _sizes(engine, sku, region, usable=usable, tenant="", limit=limit)
    return Offer(
        region,
        sku.sku,
        sku.capacity_shape.value,
        "node",
        len(serving),
        in_use,
        len(serving) - in_use,
        usable,
        MappingProxyType(dict(sorted(blocked.items()))),
        sizes,
        _dedicated(engine, sku, region, serving, limit),
    )


def _whole_reason(sku: m.Sku, f: fleetgraph.NodeFacts, claims: Sequence[plans.ExistingClaim]) -> Blocked | None:
    """The first reason, in this order: node, fabric, slice claims, cleanup, tenant."""
    fabric_ok = not f.slots or any(fabric.fabric_serves(sku.network_fabric, s.fabric) for s in f.slots)
    checks = (
        _node_reason(f),
        None if fabric_ok else Blocked.FABRIC,
        Blocked.SLICE_ACTIVE if claims else None,
        Blocked.CLEANUP_BLOCKED if any(s.status is states.SlotStatus.CLEANUP_BLOCKED for s in f.slots) else None,
        Blocked.CLEANUP if f.cleanup_pending else None,
        Blocked.HOST_DRIFT if f.host_blocked else None,
        Blocked.TENANT_BOUNDARY if f.org else None,
    )
    return next((c for c in checks if c is not None), None)


# -------------------------------------------------------------------- nodes


def _summary(
    memo: Memo, engine: placing.Engine, f: fleetgraph.NodeFacts, claims: tuple[plans.ExistingClaim, ...]
) -> NodeSummary:
    mode = engine.mode(f.name).value
    hit = memo.summaries.get(f.name)
    if hit is not None and hit[0] is f and hit[1] == claims and hit[2] == mode:
        return hit[3]
    summary = _node_summary(f, claims, mode)
    memo.summaries[f.name] = (f, claims, mode, summary)
    return summary


def _node_summary(f: fleetgraph.NodeFacts, claims: Sequence[plans.ExistingClaim], mode: str) -> NodeSummary:
    by_slot: dict[int, states.ClaimStatus] = {}
    for c in claims:
        if c.kind is states.ClaimKind.NODE_EXCLUSIVE:
            by_slot.update({s.index: c.status for s in f.slots})
        elif c.slot_index is not None:
            by_slot[c.slot_index] = c.status
    slots: Counter[str] = Counter()
    for s in f.slots:
        if s.status is not states.SlotStatus.AVAILABLE:
            slots[s.status.value] += 1
        elif s.index in by_slot:
            slots[by_slot[s.index].value] += 1
        elif s.ineligible:
            slots["ineligible"] += 1
        elif s.host_blocked:
            slots[Blocked.HOST_DRIFT.value] += 1
        else:
            slots[states.SlotStatus.AVAILABLE.value] += 1
    parked = f.admin_state is not m.AdminState.ACTIVE
    return NodeSummary(
        name=f.name,
        region=f.region,
        pool=f.pool,
        org=f.org,
        admin_state=f.admin_state.value,
        healthy=f.healthy,
        capability=f.capability.capability.value,
        capability_reasons=tuple(code for code, _ in f.capability.reasons),
        mode=mode,
        slots=MappingProxyType(dict(sorted(slots.items()))),
        allocations=tuple(sorted({c.allocation_id for c in claims})),
        drained=parked and not claims and f.cleanup_pending == 0,
        corrupt=f.corrupt,
        drifted=tuple((s.index, s.host_blocked) for s in f.slots if s.host_blocked),
    )
