"""`plan(desired, observed) -> Plan`: placements, releases, and a reason for the rest.

The pure centre of the central reconciler. Allocations are placed oldest
request first (then by id), each one seeing the claims of those placed
before it, through the same `placing.Engine` the simulator measures. An
allocation marked released that still holds claims becomes a Release; one
that already holds claims is never placed again; one that cannot be placed
becomes a Pending with a stable code (`reconciler.placement.reasons`) and a sentence:
among them one with no viable image (`plan.image_unavailable`, seed 002 §4), and,
when the fleet keeps a reserve of empty hosts for whole-host requests
(`fleet.placement.whole_host_reserve`, `reserving.Holding`), a smaller request
that would open one of them (`plan.sku_unavailable.reserved_for_whole_host`).

Same input, same plan: no I/O, no clock, no randomness.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from types import MappingProxyType

from desired import defaults
from desired import models as m
from desired.state import DesiredState
from policies import images
from reconciler import plans
from reconciler.placement import placing, reasons, reserving
from schemas import states


def plan(desired: DesiredState, observed: plans.Observed, *, policy: str | None = None) -> plans.Plan:
    """Decide where every pending allocation goes, or say exactly why it cannot.

    `policy` overrides `fleet.placement.policy` (one of `policies.packing.Policy`).
    """
    by_alloc = _claims_by_allocation(observed)
    if not _any_to_place(desired, observed, by_alloc) and not _to_release(desired, by_alloc):
        # Nothing to decide (an inventory with no requests yet, its first apply above all): no engine,
        # whose index of every node and slot was half a second of a cold apply at 10,000 nodes.
        placing.policy_of(desired, policy)  # an unknown policy is refused all the same
        return plans.Plan((), (), ())
    return plan_with(placing.Engine(desired, observed, policy=policy), desired, observed)


def plan_with(engine: placing.Engine, desired: DesiredState, observed: plans.Observed) -> plans.Plan:
    """`plan` on an engine that already holds exactly `observed` for `desired` (a fresh one, or one
    `reconciler.placement.replanning` brought up to date); the engine keeps the placements it made."""
    by_alloc = _claims_by_allocation(observed)
    releases = _releases(desired, engine, by_alloc)
    attempts = (desired.fleet.placement.max_claim_attempts if desired.fleet else defaults.CLAIM_CANDIDATES) - 1
    placements: list[plans.Placement] = []
    pending: list[plans.Pending] = []
    todo = _to_place(desired, observed, by_alloc)
    holding = reserving.Holding.of(engine, desired.fleet)
    place = engine.place if holding is None else holding.place
    if holding is not None:  # every whole-host request of the pass that could be placed waits until it is
        for alloc in todo:
            whole = holding.whole(alloc.sku, alloc.gpu_count)
            if whole and _image(desired, engine, alloc, desired.skus.get(alloc.sku))[2] is None:
                holding.wait(_counted(alloc))
    for alloc in todo:
        sku_doc = desired.skus.get(alloc.sku)
        image, image_doc, why = _image(desired, engine, alloc, sku_doc)
        if why is not None and sku_doc is not None:
            pending.append(_no_image(alloc, sku_doc, image, why))
            continue
        req = placing.Request(
            alloc.id,
            alloc.tenant,
            alloc.sku,
            alloc.gpu_count,
            alloc.region,
            alloc.vm_profile,
            alloc.requested_at.timestamp(),
            placing.lease_end(alloc),
            observed.avoid.get(alloc.id, frozenset()),
            image_doc.digest_sha256 if image_doc is not None else None,
        )
        out = place(req, alternatives=attempts)
        if isinstance(out, placing.Refused):
            pending.append(plans.Pending(alloc.id, out.code, out.message, MappingProxyType(dict(out.details))))
            continue
        if holding is not None:
            holding.wait(req, -1)
        placements.append(
            plans.Placement(
                allocation_id=alloc.id,
                tenant=alloc.tenant,
                sku=alloc.sku,
                capacity_shape=out.capacity_shape.value,
                gpu_count=alloc.gpu_count,
                region=alloc.region,
                node=out.node,
                slot_indexes=out.slot_indexes,
                profile=out.profile,
                image=image,
                alternatives=out.alternatives,
            )
        )
    return plans.Plan(tuple(placements), tuple(pending), releases)


def _claims_by_allocation(observed: plans.Observed) -> dict[str, list[plans.ExistingClaim]]:
    by_alloc: dict[str, list[plans.ExistingClaim]] = defaultdict(list)
    for claim in observed.claims:
        by_alloc[claim.allocation_id].append(claim)
    return by_alloc


def _unplaced(
    desired: DesiredState, observed: plans.Observed, by_alloc: dict[str, list[plans.ExistingClaim]]
) -> Iterator[m.Allocation]:
    """Present allocations that hold no claims."""
    held = set(by_alloc) | set(observed.placed)
    return (a for a in desired.allocations.values() if a.state is m.AllocationState.PRESENT and a.id not in held)


def _any_to_place(
    desired: DesiredState, observed: plans.Observed, by_alloc: dict[str, list[plans.ExistingClaim]]
) -> bool:
    return any(True for _ in _unplaced(desired, observed, by_alloc))


def _to_place(
    desired: DesiredState, observed: plans.Observed, by_alloc: dict[str, list[plans.ExistingClaim]]
) -> list[m.Allocation]:
    """`_unplaced`, oldest request first (then by id)."""
    return sorted(_unplaced(desired, observed, by_alloc), key=lambda a: (a.requested_at, a.id))


def _to_release(desired: DesiredState, by_alloc: dict[str, list[plans.ExistingClaim]]) -> list[str]:
    """Allocations marked released whose claims are not all releasing yet, by id."""
    out: list[str] = []
    for aid in sorted(by_alloc):
        alloc = desired.allocations.get(aid)
        if alloc is None or alloc.state is not m.AllocationState.RELEASED:
            continue
        if all(c.status is states.ClaimStatus.RELEASING for c in by_alloc[aid]):
            continue  # already on its way out
        out.append(aid)
    return out


def _image(
    desired: DesiredState, engine: placing.Engine, alloc: m.Allocation, sku_doc: m.Sku | None
) -> tuple[str | None, m.Image | None, str | None]:
    """The allocation's image, its document, and why it is not viable (None: viable, or not asked yet)."""
    image = alloc.image or (default_image(desired, sku_doc) if sku_doc is not None else None)
    image_doc = desired.images.get(image) if image is not None else None
    # Seed 002 §4: no placement without a viable image (a valid SKU and count first: their codes win).
    if sku_doc is None or isinstance(engine.spec(alloc.sku, alloc.gpu_count, alloc.vm_profile), placing.Refused):
        return image, image_doc, None
    return image, image_doc, images.unviable(desired.images, image, sku_doc, alloc.requested_at)


def _counted(alloc: m.Allocation) -> placing.Request:
    """What the reserve reads of an allocation to count it (`reserving.Holding.wait`)."""
    return placing.Request(alloc.id, alloc.tenant, alloc.sku, alloc.gpu_count, alloc.region, alloc.vm_profile)


def _releases(
    desired: DesiredState, engine: placing.Engine, by_alloc: dict[str, list[plans.ExistingClaim]]
) -> tuple[plans.Release, ...]:
    out: list[plans.Release] = []
    for aid in _to_release(desired, by_alloc):
        claims = by_alloc[aid]
        per_node: dict[str, set[int]] = defaultdict(set)
        for c in claims:
            if c.kind is states.ClaimKind.NODE_EXCLUSIVE:
                node = engine.by_name.get(c.node)
                per_node[c.node].update(node.slot_indexes if node else ())
            elif c.slot_index is not None:
                per_node[c.node].add(c.slot_index)
        out.extend(plans.Release(aid, node, tuple(sorted(slots))) for node, slots in sorted(per_node.items()))
    return tuple(out)


def default_image(desired: DesiredState, sku: m.Sku) -> str | None:
    """The image an allocation gets when it names none (`policies.images.default`)."""
    return images.default(desired.images, sku)


_NO_IMAGE = {
    images.NONE: "names no image and no active image with a digest fits SKU {sku} ({target})",
    images.UNKNOWN: "names image {image}, which this revision does not declare",
    images.INACTIVE: "names image {image}, which is no longer offered to requests made when it was",
    images.WRONG_TARGET: "names image {image}, which does not target {target} (SKU {sku})",
    images.INCOMPATIBLE: "names image {image}, which is not compatible with SKU {sku}",
    images.NO_DIGEST: "names image {image}, which has no sha256 digest to verify before a disk is written",
}


def _no_image(alloc: m.Allocation, sku: m.Sku, image: str | None, why: str) -> plans.Pending:
    text = _NO_IMAGE[why].format(sku=sku.sku, image=image, target=images.target(sku))
    return plans.Pending(
        alloc.id,
        reasons.IMAGE_UNAVAILABLE,
        f"allocation {alloc.id} {text}; it stays pending until an image is viable",
        MappingProxyType({"image": image, "why": why, "target": images.target(sku)}),
    )
