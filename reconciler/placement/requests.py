"""What a placement request asks and what the engine answers, with the request shape checks.

These are the values every part of the engine shares (`fleetstate`,
`picking`, `counting`, `explaining`); `placing.Engine` re-exports them for
its callers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import MappingProxyType

from desired import models as m
from policies import packing, profiles
from reconciler import plans
from reconciler.placement import reasons

Refused = reasons.Refused  # the engine's answer when nothing can take a request


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


TIERS = (Tier.OWN, Tier.SHARED)  # the order a request looks at them: dedicated nodes first


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    slot_indexes: tuple[int, ...]
    capacity_shape: m.CapacityShape
    profile: profiles.Profile | None
    alternatives: tuple[plans.Candidate, ...] = ()


@dataclass(frozen=True, slots=True)
class Spec:
    """A validated request shape (SKU, count, profile)."""

    sku: m.Sku
    rule: m.TopologyRule
    profile: profiles.Profile | None


class Specs:
    """Request shapes checked against one revision's SKUs, each shape once (they repeat per request)."""

    def __init__(self, skus: dict[str, m.Sku]) -> None:
        self.skus = skus
        self._known: dict[tuple[str, int, str | None], Spec | Refused] = {}

    def get(self, sku_name: str, gpu_count: int, vm_profile: str | None = None) -> Spec | Refused:
        key = (sku_name, gpu_count, vm_profile)
        out = self._known.get(key)
        if out is None:
            out = self._known[key] = self._check(sku_name, gpu_count, vm_profile)
        return out

    def _check(self, sku_name: str, gpu_count: int, vm_profile: str | None) -> Spec | Refused:
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
