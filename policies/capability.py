"""Node capability: which products may ever target this node.

Seed 000/003: slice capability is a promotion decision, never a hardware
inference. slice_supported = slice profile tag AND firmware profile ready AND
approved eligible slots. Tags alone, or readiness alone, never make a node
slice-capable. Occupancy (slice_active, baremetal_active, ...) is a separate
question answered by `policies.modes` from claims.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from desired import models as m
from policies import codes as policies_codes


class Capability(enum.StrEnum):
    BAREMETAL_ONLY = "baremetal_only"
    SLICE_CANDIDATE = "slice_candidate"
    BOTH_CAPABLE = "both_capable"


# Stable reason codes for a slice candidate. Do not change the string values.
NO_SLICE_TAG = policies_codes.NODE_NO_SLICE_PROFILE_TAG
FIRMWARE_NOT_READY = policies_codes.NODE_FIRMWARE_NOT_READY
NO_APPROVED_SLOTS = policies_codes.NODE_NO_APPROVED_SLOTS
STORAGE_NOT_SLICE = policies_codes.NODE_STORAGE_NOT_SLICE


@dataclass(frozen=True, slots=True)
class CapabilityVerdict:
    capability: Capability
    reasons: tuple[tuple[str, str], ...] = ()

    @property
    def slice_capable(self) -> bool:
        return self.capability is Capability.BOTH_CAPABLE


def node_capability(node: m.Node, *, firmware_ready: bool, eligible_slots: int) -> CapabilityVerdict:
    """Derive capability from intent (tag), evidence (firmware) and approval (slots)."""
    if not node.slice_tagged:
        return CapabilityVerdict(
            Capability.BAREMETAL_ONLY,
            ((NO_SLICE_TAG, "no gpuaas-profile-slice-vm tag"),),
        )
    reasons: list[tuple[str, str]] = []
    if not firmware_ready:
        reasons.append((FIRMWARE_NOT_READY, "slice firmware profile not reported ready"))
    if node.storage_mode is not m.StorageMode.SLICE:
        reasons.append((STORAGE_NOT_SLICE, f"storage_mode is {node.storage_mode.value!r}, not 'slice'"))
    if eligible_slots == 0:
        reasons.append((NO_APPROVED_SLOTS, "no approved, eligible slots"))
    if reasons:
        return CapabilityVerdict(Capability.SLICE_CANDIDATE, tuple(reasons))
    return CapabilityVerdict(Capability.BOTH_CAPABLE)
