"""Stable codes for every request the planner cannot place.

Codes are part of the product's interface: operators, CI jobs and the portal match on them.
Do not change the string values. Once set, they are set. Each constant has its one-line meaning
above it; docs/error-codes.md is generated from these lines (python -m tests.errorcodes --write).
"""

from __future__ import annotations

# the request's GPU count is not one the SKU allows
GPU_COUNT_NOT_ALLOWED = "plan.gpu_count_not_allowed"
# no viable image: active, fitting the SKU's target, with a digest; details say why
IMAGE_UNAVAILABLE = "plan.image_unavailable"
# the request names a SKU that is not sold (inactive)
SKU_INACTIVE = "plan.sku_inactive"
# not enough free GPUs in aggregate
SKU_UNAVAILABLE_CAPACITY = "plan.sku_unavailable.capacity"
# the only candidates are draining
SKU_UNAVAILABLE_DRAINING = "plan.sku_unavailable.draining"
# nodes with the GPU, but not the promised fabric
SKU_UNAVAILABLE_FABRIC = "plan.sku_unavailable.fabric"
# the only candidates are in maintenance
SKU_UNAVAILABLE_MAINTENANCE = "plan.sku_unavailable.maintenance"
# baremetal: every candidate holds a claim
SKU_UNAVAILABLE_NO_EMPTY_NODE = "plan.sku_unavailable.no_empty_node"
# no node in the region serves this SKU at all
SKU_UNAVAILABLE_NO_NODE = "plan.sku_unavailable.no_node"
# the only candidates' hosts report node-wide corruption
SKU_UNAVAILABLE_NODE_CORRUPT = "plan.sku_unavailable.node_corrupt"
# tag/firmware/slot approval incomplete
SKU_UNAVAILABLE_NOT_SLICE_READY = "plan.sku_unavailable.not_slice_ready"
# a smaller request would open one of the empty hosts kept for whole-host requests waiting before it
SKU_UNAVAILABLE_RESERVED_FOR_WHOLE_HOST = "plan.sku_unavailable.reserved_for_whole_host"
# every candidate belongs to another org
SKU_UNAVAILABLE_TENANT_BOUNDARY = "plan.sku_unavailable.tenant_boundary"
# enough free GPUs in aggregate, no topology-safe set
SKU_UNAVAILABLE_TOPOLOGY = "plan.sku_unavailable.topology"
# the only candidates fail health checks
SKU_UNAVAILABLE_UNHEALTHY = "plan.sku_unavailable.unhealthy"
# the request names a SKU the catalog does not have
SKU_UNKNOWN = "plan.sku_unknown"
