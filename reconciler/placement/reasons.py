"""Stable codes for every request the planner cannot place, and the static reasons.

Do not change the string values: operators, the portal and tests match on
them. Each Pending carries one of these plus a sentence and details. The
reasons that depend on claims (no empty node, topology, capacity) come from
the engine's indexes (`placing.Engine.explain`); the ones that do not are
worked out here from the node facts, most fundamental first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from desired import models as m
from policies import fabric
from reconciler.placement import codes as placement_codes
from reconciler.placement import fleetgraph

SKU_UNKNOWN = placement_codes.SKU_UNKNOWN
SKU_INACTIVE = placement_codes.SKU_INACTIVE
GPU_COUNT = placement_codes.GPU_COUNT_NOT_ALLOWED

# The `sku_unavailable` family: the request is valid, nothing can take it now.
NO_NODE = placement_codes.SKU_UNAVAILABLE_NO_NODE  # no node in the region serves this SKU at all
FABRIC = placement_codes.SKU_UNAVAILABLE_FABRIC  # nodes with the GPU, but not the promised fabric
NOT_SLICE_READY = placement_codes.SKU_UNAVAILABLE_NOT_SLICE_READY  # tag/firmware/slot approval incomplete
TENANT_BOUNDARY = placement_codes.SKU_UNAVAILABLE_TENANT_BOUNDARY  # every candidate belongs to another org
DRAINING = placement_codes.SKU_UNAVAILABLE_DRAINING  # the only candidates are draining
MAINTENANCE = placement_codes.SKU_UNAVAILABLE_MAINTENANCE  # the only candidates are in maintenance
UNHEALTHY = placement_codes.SKU_UNAVAILABLE_UNHEALTHY  # the only candidates fail health checks
NODE_CORRUPT = placement_codes.SKU_UNAVAILABLE_NODE_CORRUPT  # the only candidates' hosts report node-wide corruption
NO_EMPTY_NODE = placement_codes.SKU_UNAVAILABLE_NO_EMPTY_NODE  # baremetal: every candidate holds a claim
TOPOLOGY = placement_codes.SKU_UNAVAILABLE_TOPOLOGY  # enough free GPUs in aggregate, no topology-safe set
CAPACITY = placement_codes.SKU_UNAVAILABLE_CAPACITY  # not enough free GPUs in aggregate
# It fits, but only by opening one of the empty hosts fleet.placement.whole_host_reserve keeps (`reserving`).
RESERVED = placement_codes.SKU_UNAVAILABLE_RESERVED_FOR_WHOLE_HOST
# No viable image (active, fits the SKU's target, with a digest): seed 002 §4. Details say why.
IMAGE_UNAVAILABLE = placement_codes.IMAGE_UNAVAILABLE

ALL = (
    SKU_UNKNOWN,
    SKU_INACTIVE,
    GPU_COUNT,
    NO_NODE,
    FABRIC,
    NOT_SLICE_READY,
    TENANT_BOUNDARY,
    DRAINING,
    MAINTENANCE,
    UNHEALTHY,
    NODE_CORRUPT,
    NO_EMPTY_NODE,
    TOPOLOGY,
    CAPACITY,
    RESERVED,
    IMAGE_UNAVAILABLE,
)


@dataclass(frozen=True, slots=True)
class Refused:
    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


def static_refusal(  # noqa: PLR0911  # one early return per reason, most fundamental first
    nodes: Sequence[fleetgraph.NodeFacts], sku: m.Sku, region: str, tenant: str
) -> Refused | None:
    """Reasons that do not depend on claims: region, SKU, fabric, readiness, tenant, admin."""
    facts = [f for f in nodes if f.region == region]
    if not facts:
        return Refused(NO_NODE, f"no node is declared in region {region}")
    whole = sku.capacity_shape is m.CapacityShape.BAREMETAL
    if whole:
        serving = [f for f in facts if f.baremetal_sku == sku.sku]
        if not serving:
            return Refused(NO_NODE, f"no node in {region} is leased as {sku.sku}")
        fabric_ok = [
            f
            for f in serving
            if not f.slots or any(fabric.fabric_serves(sku.network_fabric, s.fabric) for s in f.slots)
        ]
        ready = fabric_ok
    else:
        serving = [f for f in facts if any(s.gpu_model == sku.accelerator_model for s in f.slots)]
        if not serving:
            return Refused(NO_NODE, f"no node in {region} has {sku.accelerator_model} slots for {sku.sku}")
        fabric_ok = [
            f
            for f in serving
            if any(
                s.gpu_model == sku.accelerator_model and fabric.fabric_serves(sku.network_fabric, s.fabric)
                for s in f.slots
            )
        ]
        ready = [
            f
            for f in fabric_ok
            if f.slice_capable
            and any(
                not s.ineligible and fabric.mismatch(sku, s.gpu_model, s.fabric, s.pinned_sku) is None for s in f.slots
            )
        ]
    if not fabric_ok:
        have = sorted({s.fabric.value for f in serving for s in f.slots})
        return Refused(
            FABRIC,
            f"{sku.sku} needs {sku.network_fabric.value} fabric; the {len(serving)} node(s) in "
            f"{region} that could serve it offer only {', '.join(have) or 'no fabric'}",
            MappingProxyType({"fabrics": tuple(have), "nodes": len(serving)}),
        )
    if not ready:
        why = Counter(code for f in fabric_ok for code, _ in f.capability.reasons)
        if not why:
            why = Counter(code for f in fabric_ok for s in f.slots for code in s.ineligible)
        text = ", ".join(f"{c} x{n}" for c, n in sorted(why.items())) or "no eligible slot"
        return Refused(
            NOT_SLICE_READY,
            f"the {len(fabric_ok)} node(s) in {region} with {sku.accelerator_model} "
            f"{sku.network_fabric.value} slots are not slice-capable yet ({text})",
            MappingProxyType({"nodes": len(fabric_ok), "why": dict(why)}),
        )
    mine = [f for f in ready if f.org in (None, tenant)]
    if not mine:
        orgs = sorted({f.org or "" for f in ready})
        return Refused(
            TENANT_BOUNDARY,
            f"every node in {region} that serves {sku.sku} is dedicated to another "
            f"organisation ({', '.join(orgs)}); tenant {tenant} may not use them",
            MappingProxyType({"orgs": tuple(orgs)}),
        )
    admin = [f for f in mine if f.admin_state is m.AdminState.ACTIVE]
    if not admin:
        draining = sum(1 for f in mine if f.admin_state is m.AdminState.DRAINING)
        code = DRAINING if draining else MAINTENANCE
        state = "draining" if draining else "in maintenance"
        return Refused(
            code,
            f"the only {len(mine)} node(s) in {region} that serve {sku.sku} are {state}; they take nothing new",
            MappingProxyType({"draining": draining, "maintenance": len(mine) - draining}),
        )
    if not any(f.healthy and not f.corrupt for f in admin):
        corrupt = sorted(f.name for f in admin if f.healthy and f.corrupt)
        if corrupt:
            evidence = sorted({c for f in admin for c in f.corrupt})
            return Refused(
                NODE_CORRUPT,
                f"the only {len(admin)} node(s) in {region} that serve {sku.sku} fail health checks or "
                f"their hosts report node-wide corruption ({', '.join(evidence)}): "
                f"{', '.join(corrupt[:10])}",
                MappingProxyType({"nodes": len(admin), "corrupt": tuple(corrupt), "evidence": tuple(evidence)}),
            )
        return Refused(
            UNHEALTHY,
            f"the only {len(admin)} node(s) in {region} that serve {sku.sku} fail health checks",
            MappingProxyType({"nodes": len(admin)}),
        )
    return None
