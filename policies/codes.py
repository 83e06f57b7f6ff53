"""Stable codes of the pure policy rules: slot eligibility, node modes, capability, profiles.

Codes are part of the product's interface: operators, CI jobs and the portal match on them.
Do not change the string values. Once set, they are set. Each constant has its one-line meaning
above it; docs/error-codes.md is generated from these lines (python -m tests.errorcodes --write).
"""

from __future__ import annotations

# the slot records no `nvme_identity`: never scheduled, and its host refuses to write, wipe or verify the disk
DISK_IDENTITY_MISSING = "disk.identity_missing"
# blocking drift: a slot's disk is gone
DRIFT_DISK_MISSING = "drift.disk.missing"
# blocking drift: a slot's disk is mounted on the host
DRIFT_DISK_MOUNTED = "drift.disk.mounted"
# blocking drift: a slot's disk holds the host's OS
DRIFT_DISK_OS_DISK = "drift.disk.os_disk"
# blocking drift: a free slot's disk carries a filesystem or partition signature
DRIFT_DISK_SIGNATURE_PRESENT = "drift.disk.signature_present"
# blocking drift: a slot's disk is not the one its slot map approved (another serial)
DRIFT_IDENTITY_CHANGED = "drift.identity.changed"
# blocking drift: a slot's GPU or VF is gone from the PCI bus
DRIFT_PCI_MISSING = "drift.pci.missing"
# blocking drift: a slot's GPU or VF is not bound to vfio-pci
DRIFT_PCI_NOT_VFIO = "drift.pci.not_vfio"
# node evidence: blocking drift on every reported slot
HOST_DRIFT_EVERY_SLOT = "host.drift.every_slot"
# the slot's last wipe or verify failed (cleanup_blocked on the host)
HOST_WIPE_FAILED = "host.wipe.failed"
# not a slice candidate: the node's firmware is not reported ready
NODE_FIRMWARE_NOT_READY = "node.firmware_not_ready"
# the node cannot take slices: it is leased whole (baremetal)
NODE_MODE_BAREMETAL_ACTIVE = "node.mode.baremetal_active"
# the node waits on a cleanup that failed (a wipe or verify)
NODE_MODE_CLEANUP_BLOCKED = "node.mode.cleanup_blocked"
# the node waits on cleanup before it can change mode
NODE_MODE_CLEANUP_PENDING = "node.mode.cleanup_pending"
# the node is draining: no new placements
NODE_MODE_DRAINING = "node.mode.draining"
# the node is in maintenance: no new placements
NODE_MODE_MAINTENANCE = "node.mode.maintenance"
# the node has no free approved slot
NODE_MODE_NO_FREE_SLOTS = "node.mode.no_free_slots"
# the node cannot serve slices (profile tag, firmware or slot approval missing)
NODE_MODE_NOT_SLICE_CAPABLE = "node.mode.not_slice_capable"
# the node cannot be leased whole: slices run on it
NODE_MODE_SLICE_ACTIVE = "node.mode.slice_active"
# the node's storage is not owned per slice
NODE_MODE_STORAGE_NOT_SLICE = "node.mode.storage_not_slice"
# the node is unavailable (its host is silent or unhealthy)
NODE_MODE_UNAVAILABLE = "node.mode.unavailable"
# not a slice candidate: the node has no approved slot
NODE_NO_APPROVED_SLOTS = "node.no_approved_slots"
# not a slice candidate: the node carries no slice profile tag
NODE_NO_SLICE_PROFILE_TAG = "node.no_slice_profile_tag"
# not a slice candidate: the node's storage is not owned per slice
NODE_STORAGE_NOT_SLICE = "node.storage_not_slice"
# the VM profile's GPU count differs from the request's
PLAN_PROFILE_GPU_COUNT_MISMATCH = "plan.profile.gpu_count_mismatch"
# the SKU names no VM profile for the request
PLAN_PROFILE_NONE = "plan.profile.none"
# the VM profile the request names is not the SKU's
PLAN_PROFILE_UNKNOWN = "plan.profile.unknown"
# ineligible slot: it has a parent slot (partitions are not scheduled)
SLOT_CHILD_SLOT = "slot.child_slot"
# ineligible slot: it is disabled
SLOT_DISABLED = "slot.disabled"
# ineligible slot: discovery found blockers on it
SLOT_DISCOVERY_BLOCKERS = "slot.discovery_blockers"
# the slot's fabric is not the one the SKU promises
SLOT_FABRIC_MISMATCH = "slot.fabric_mismatch"
# ineligible slot: its fabric claim mode is not per_slot_vf
SLOT_FABRIC_NOT_PER_SLOT_VF = "slot.fabric_not_per_slot_vf"
# ineligible slot: it offers less than a whole GPU of compute
SLOT_FRACTIONAL_COMPUTE = "slot.fractional_compute"
# ineligible slot: it allows more than one claim
SLOT_MAX_CLAIMS = "slot.max_claims"
# the slot's GPU model is not the SKU's
SLOT_MODEL_MISMATCH = "slot.model_mismatch"
# ineligible slot: it names no fabric VF address
SLOT_NO_VF_ADDRESS = "slot.no_vf_address"
# ineligible slot: it has no destructive wipe policy
SLOT_NO_WIPE_POLICY = "slot.no_wipe_policy"
# ineligible slot: it is not approved
SLOT_NOT_APPROVED = "slot.not_approved"
# ineligible slot: its sharing model is not exclusive_device
SLOT_NOT_EXCLUSIVE_DEVICE = "slot.not_exclusive_device"
# the slot is pinned to another SKU
SLOT_PINNED_TO_OTHER_SKU = "slot.pinned_to_other_sku"
# ineligible slot: its storage_ownership is not slice
SLOT_STORAGE_NOT_SLICE = "slot.storage_not_slice"
# ineligible slot: its fabric VF is shared with another slot
SLOT_VF_SHARED = "slot.vf_shared"
