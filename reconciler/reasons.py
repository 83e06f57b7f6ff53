"""Stable codes for every request the planner cannot place.

Do not change the string values: operators, the portal and tests match on
them. Each Pending carries one of these plus a sentence and details.
"""

from __future__ import annotations

SKU_UNKNOWN = "plan.sku_unknown"
SKU_INACTIVE = "plan.sku_inactive"
GPU_COUNT = "plan.gpu_count_not_allowed"

# The `sku_unavailable` family: the request is valid, nothing can take it now.
NO_NODE = "plan.sku_unavailable.no_node"  # no node in the region serves this SKU at all
FABRIC = "plan.sku_unavailable.fabric"  # nodes with the GPU, but not the promised fabric
NOT_SLICE_READY = "plan.sku_unavailable.not_slice_ready"  # tag/firmware/slot approval incomplete
TENANT_BOUNDARY = "plan.sku_unavailable.tenant_boundary"  # every candidate belongs to another org
DRAINING = "plan.sku_unavailable.draining"  # the only candidates are draining
MAINTENANCE = "plan.sku_unavailable.maintenance"  # the only candidates are in maintenance
UNHEALTHY = "plan.sku_unavailable.unhealthy"  # the only candidates fail health checks
NO_EMPTY_NODE = "plan.sku_unavailable.no_empty_node"  # baremetal: every candidate holds a claim
TOPOLOGY = "plan.sku_unavailable.topology"  # enough free GPUs in aggregate, no topology-safe set
CAPACITY = "plan.sku_unavailable.capacity"  # not enough free GPUs in aggregate

ALL = (
    SKU_UNKNOWN, SKU_INACTIVE, GPU_COUNT, NO_NODE, FABRIC, NOT_SLICE_READY, TENANT_BOUNDARY,
    DRAINING, MAINTENANCE, UNHEALTHY, NO_EMPTY_NODE, TOPOLOGY, CAPACITY,
)
