"""Slot eligibility: may this approved slot ever be sold as a whole-GPU slice?

Seeds 000 and 001: a slot is schedulable only with complete metadata
(`storage_ownership: slice`, a wipe policy, a per-slot VF that no other slot
on the node uses) and only as an exclusive whole device. Child slots,
shared devices and fractional compute are reserved for later phases and must
never be sold as whole-GPU slices by mistake.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from desired import models as m
from policies import codes as policies_codes

# Stable reason codes. Do not change the string values.
NOT_APPROVED = policies_codes.SLOT_NOT_APPROVED
DISABLED = policies_codes.SLOT_DISABLED
NO_STORAGE_OWNERSHIP = policies_codes.SLOT_STORAGE_NOT_SLICE
NO_WIPE_POLICY = policies_codes.SLOT_NO_WIPE_POLICY
NOT_PER_SLOT_VF = policies_codes.SLOT_FABRIC_NOT_PER_SLOT_VF
NO_VF_ADDRESS = policies_codes.SLOT_NO_VF_ADDRESS
SHARED_VF = policies_codes.SLOT_VF_SHARED
NOT_EXCLUSIVE = policies_codes.SLOT_NOT_EXCLUSIVE_DEVICE
HAS_PARENT = policies_codes.SLOT_CHILD_SLOT
MULTI_CLAIM = policies_codes.SLOT_MAX_CLAIMS
FRACTIONAL = policies_codes.SLOT_FRACTIONAL_COMPUTE
HAS_BLOCKERS = policies_codes.SLOT_DISCOVERY_BLOCKERS
NO_DISK_IDENTITY = policies_codes.DISK_IDENTITY_MISSING


@dataclass(frozen=True, slots=True)
class Ineligible:
    code: str
    field: str
    message: str


def slot_reasons(slot: m.Slot, *, vf_counts: Counter[str], approved: bool = True) -> list[Ineligible]:
    """Every reason this slot can never be scheduled; empty means eligible.

    `vf_counts` counts each fabric VF address across the node's slots, so a VF
    reused by two slots disqualifies both.
    """
    out: list[Ineligible] = []
    if not approved:
        out.append(Ineligible(NOT_APPROVED, "approval_required", "slot map still has approval_required: true"))
    if not slot.enabled:
        out.append(Ineligible(DISABLED, "enabled", "slot is disabled"))
    meta = slot.capacity_metadata
    if meta.storage_ownership != "slice":
        out.append(
            Ineligible(
                NO_STORAGE_OWNERSHIP,
                "capacity_metadata.storage_ownership",
                f"storage_ownership is {meta.storage_ownership!r}, not 'slice'",
            )
        )
    if not (meta.destructive_wipe_policy or "").strip():
        out.append(
            Ineligible(NO_WIPE_POLICY, "capacity_metadata.destructive_wipe_policy", "no destructive_wipe_policy")
        )
    if slot.fabric_claim_mode is not m.FabricClaimMode.PER_SLOT_VF:
        mode = slot.fabric_claim_mode.value if slot.fabric_claim_mode else None
        out.append(
            Ineligible(NOT_PER_SLOT_VF, "fabric_claim_mode", f"fabric_claim_mode is {mode!r}, not 'per_slot_vf'")
        )
    if not slot.fabric_vf_pci_address:
        out.append(Ineligible(NO_VF_ADDRESS, "fabric_vf_pci_address", "no fabric_vf_pci_address"))
    elif vf_counts[slot.fabric_vf_pci_address] > 1:
        out.append(
            Ineligible(
                SHARED_VF,
                "fabric_vf_pci_address",
                f"VF {slot.fabric_vf_pci_address} is used by another slot on this node",
            )
        )
    if slot.sharing_model is not m.SharingModel.EXCLUSIVE_DEVICE:
        out.append(
            Ineligible(
                NOT_EXCLUSIVE, "sharing_model", f"sharing_model is {slot.sharing_model.value!r}, not 'exclusive_device'"
            )
        )
    if slot.parent_slot_id:
        out.append(Ineligible(HAS_PARENT, "parent_slot_id", "child slot (parent_slot_id set)"))
    if slot.max_claims != 1:
        out.append(Ineligible(MULTI_CLAIM, "max_claims", f"max_claims is {slot.max_claims}, not 1"))
    if slot.compute_milli < 1000:
        out.append(
            Ineligible(FRACTIONAL, "compute_milli", f"compute_milli {slot.compute_milli} is below one whole GPU (1000)")
        )
    out += _disk_identity_reasons(slot)
    if slot.blockers:
        codes = ", ".join(b.code for b in slot.blockers)
        out.append(Ineligible(HAS_BLOCKERS, "blockers", f"discovery blockers: {codes}"))
    return out


def _disk_identity_reasons(slot: m.Slot) -> list[Ineligible]:
    # The approval must bind the disk, not its by-id name: the host refuses to
    # write or wipe a slot disk whose approval records no identity.
    if slot.nvme_identity is not None:
        return []
    return [
        Ineligible(
            NO_DISK_IDENTITY,
            "nvme_identity",
            "no nvme_identity recorded for the slot disk (`gpuaas host discover` proposes it in the candidate SlotMap)",
        )
    ]


def vf_counts(slots: Iterable[m.Slot]) -> Counter[str]:
    return Counter(s.fabric_vf_pci_address for s in slots if s.fabric_vf_pci_address)


# Memo by slot map object: the watch loop's blob cache hands out the same SlotMap object for
# an unchanged file, and validation, inventory sync and the planner each ask for its reasons.
# Keyed by id() with the object kept alive beside it, so an id is never reused while cached.
_MEMO: dict[int, tuple[m.SlotMap, dict[int, list[Ineligible]]]] = {}
_MEMO_MAX = 250_000


def eligible_slots(slot_map: m.SlotMap) -> dict[int, list[Ineligible]]:
    """Reasons per slot_index for one node's map (empty list = eligible). Callers must not mutate it."""
    hit = _MEMO.get(id(slot_map))
    if hit is not None and hit[0] is slot_map:
        return hit[1]
    counts = vf_counts(slot_map.slots)
    approved = not slot_map.approval_required
    out = {s.slot_index: slot_reasons(s, vf_counts=counts, approved=approved) for s in slot_map.slots}
    if len(_MEMO) >= _MEMO_MAX:
        _MEMO.clear()
    _MEMO[id(slot_map)] = (slot_map, out)
    return out
