"""The approval gate: may each approved slot be sold, given what the host shows now?

The decision has two halves, and `gate(approved, discovered)` (pure, behind
`gpuaas host gate`) gives both:

- desired state: `policies.eligibility`, the one function `gpuaas validate`,
  inventory and the planner use. A slot that still lists discovery blockers,
  shares its VF, is not `per_slot_vf`, or sits in a map with
  `approval_required: true` is `ineligible` with the same reason codes
  validate prints, so gate and validate never disagree about a map.
- discovery: `compare(approved, discovered)`. A slot whose GPU, fabric VF,
  disk identity or NUMA node no longer matches the approved SlotMap is
  `blocked`, with a `Drift` per difference naming the approved (old) and
  discovered (new) value, until git approves the new identity.

Every other slot stays in service: a renumbered VF on slot 3 never takes
slots 0-2 and 4-7 out of the catalog. The host reconciler's pass calls
`compare` alone: its plan carries only slots the central reconciler already
found eligible, and only their identity, not the metadata policy reads.

"New" values are what a fresh `gpuaas host discover` would propose for the
same GPU (the candidate pairing), so the drift report reads as the edit the
operator's next pull request would make. A value another approved slot
already owns is never proposed.

A disk is its by-id path and, when the approval recorded one, its
`nvme_identity`: a by-id link that now leads to a namespace with another
serial, wwid, model or size (a re-pointed link, a swapped drive) is
`drift.disk_identity`, with the differing fields old -> new.

Besides identity, a slot whose approved disk is now mounted by the host or
holds the OS is blocked too: seed rule "never touch a disk that is mounted or
is the OS disk". Signatures are not checked here: a disk in tenant use
carries the tenant's filesystem by design.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from desired import models as m
from host_reconciler import codes as host_codes
from host_reconciler.discovery import candidates, facts
from policies import eligibility
from schemas import hostplans

# Stable codes. Do not change the string values. (An unapproved map is
# eligibility's `slot.not_approved`; the gate has no code of its own for it.)
GPU_MISSING = host_codes.DRIFT_GPU_MISSING
NUMA_CHANGED = host_codes.DRIFT_NUMA_NODE
VF_MISSING = host_codes.DRIFT_VF_MISSING
VF_PARENT_CHANGED = host_codes.DRIFT_VF_PARENT
FABRIC_PARENT_MISSING = host_codes.DRIFT_FABRIC_PARENT_MISSING
DISK_MISSING = host_codes.DRIFT_DISK_MISSING
DISK_IDENTITY_CHANGED = host_codes.DRIFT_DISK_IDENTITY
DISK_MOUNTED = host_codes.DRIFT_DISK_MOUNTED
DISK_OS = host_codes.DRIFT_DISK_OS

Value = str | int | bool | None


@dataclass(frozen=True, slots=True)
class Drift:
    slot_index: int
    code: str
    field: str  # the Slot field that no longer matches ("fabric_vf_pci_address")
    old: Value  # what the approved SlotMap says
    new: Value  # what the host shows now (None: gone, nothing to propose)
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot_index": self.slot_index,
            "code": self.code,
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class GateResult:
    node: str
    schedulable: tuple[int, ...]  # slot indexes that are eligible and still match: keep selling them
    blocked: Mapping[int, tuple[Drift, ...]] = field(default_factory=dict)  # drifted from the host
    ineligible: Mapping[int, tuple[eligibility.Ineligible, ...]] = field(default_factory=dict)  # by policy
    unapproved_gpus: tuple[str, ...] = ()  # GPUs on the host that no approved slot names

    @property
    def drifts(self) -> tuple[Drift, ...]:
        return tuple(d for i in sorted(self.blocked) for d in self.blocked[i])

    @property
    def unschedulable(self) -> tuple[int, ...]:
        """Slots out of service for either half: policy (what validate reports) or drift."""
        return tuple(sorted({*self.blocked, *self.ineligible}))

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "schedulable": list(self.schedulable),
            "unschedulable": list(self.unschedulable),
            "ineligible": {
                str(i): [{"code": r.code, "field": r.field, "message": r.message} for r in rs]
                for i, rs in sorted(self.ineligible.items())
            },
            "blocked": {str(i): [d.as_dict() for d in ds] for i, ds in sorted(self.blocked.items())},
            "unapproved_gpus": list(self.unapproved_gpus),
        }


def gate(approved: m.SlotMap, discovered: facts.Discovery) -> GateResult:
    """The whole decision: eligibility of the approved map, then its comparison with the host."""
    compared = compare(approved, discovered)
    ineligible = {i: tuple(why) for i, why in eligibility.eligible_slots(approved).items() if why}
    return GateResult(
        node=compared.node,
        schedulable=tuple(i for i in compared.schedulable if i not in ineligible),
        blocked=compared.blocked,
        ineligible=ineligible,
        unapproved_gpus=compared.unapproved_gpus,
    )


def compare(approved: m.SlotMap, discovered: facts.Discovery) -> GateResult:
    """The discovery half: compare every approved slot's identity with what discovery sees now."""
    proposal = candidates.pairings(discovered)
    by_gpu = {p.gpu.pci_address: p for p in proposal}
    by_index = {p.slot_index: p for p in proposal}
    owned_gpus = {s.gpu_pci_address for s in approved.slots}
    owned_vfs = {s.fabric_vf_pci_address for s in approved.slots if s.fabric_vf_pci_address}
    owned_disks = {s.nvme_device for s in approved.slots}

    blocked: dict[int, tuple[Drift, ...]] = {}
    for slot in approved.slots:
        pairing = by_gpu.get(slot.gpu_pci_address)
        found = _gpu(slot, discovered, by_index.get(slot.slot_index), owned_gpus)
        found += _fabric(slot, discovered, pairing, owned_vfs)
        found += _disk(slot, discovered, pairing, owned_disks)
        if found:
            blocked[slot.slot_index] = tuple(found)
    discovered_gpus = sorted(g.pci_address for g in discovered.gpus)
    return GateResult(
        node=approved.node,
        schedulable=tuple(sorted(s.slot_index for s in approved.slots if s.slot_index not in blocked)),
        blocked=blocked,
        unapproved_gpus=tuple(a for a in discovered_gpus if a not in owned_gpus),
    )


def _gpu(
    slot: m.Slot,
    discovered: facts.Discovery,
    same_index: candidates.Pairing | None,
    owned: set[str],
) -> list[Drift]:
    gpu = discovered.gpu(slot.gpu_pci_address)
    if gpu is None:
        new = same_index.gpu.pci_address if same_index and same_index.gpu.pci_address not in owned else None
        return [
            Drift(
                slot.slot_index,
                GPU_MISSING,
                "gpu_pci_address",
                slot.gpu_pci_address,
                new,
                f"GPU {slot.gpu_pci_address} is gone" + (f"; discovery now proposes {new}" if new else ""),
            )
        ]
    numa = candidates.slot_numa(gpu.numa_node)
    if numa != slot.numa_node:
        return [
            Drift(
                slot.slot_index,
                NUMA_CHANGED,
                "numa_node",
                slot.numa_node,
                numa,
                f"GPU {gpu.pci_address} is on NUMA node {numa}, approved on {slot.numa_node}",
            )
        ]
    return []


def _fabric(
    slot: m.Slot, discovered: facts.Discovery, pairing: candidates.Pairing | None, owned: set[str]
) -> list[Drift]:
    if slot.fabric_vf_pci_address:
        vf = discovered.vf(slot.fabric_vf_pci_address)
        if vf is None:
            proposed = pairing.vf.pci_address if pairing and pairing.vf else None
            new = proposed if proposed not in owned else None
            return [
                Drift(
                    slot.slot_index,
                    VF_MISSING,
                    "fabric_vf_pci_address",
                    slot.fabric_vf_pci_address,
                    new,
                    f"VF {slot.fabric_vf_pci_address} is gone" + (f"; discovery now proposes {new}" if new else ""),
                )
            ]
        if slot.fabric_parent_device and vf.parent != slot.fabric_parent_device:
            return [
                Drift(
                    slot.slot_index,
                    VF_PARENT_CHANGED,
                    "fabric_parent_device",
                    slot.fabric_parent_device,
                    vf.parent,
                    f"VF {vf.pci_address} now belongs to {vf.parent}, approved under {slot.fabric_parent_device}",
                )
            ]
        return []
    if slot.fabric_parent_device and discovered.fabric_device(slot.fabric_parent_device) is None:
        new = pairing.fabric.pci_address if pairing and pairing.fabric else None
        return [
            Drift(
                slot.slot_index,
                FABRIC_PARENT_MISSING,
                "fabric_parent_device",
                slot.fabric_parent_device,
                new,
                f"fabric device {slot.fabric_parent_device} is gone",
            )
        ]
    return []


def _disk(
    slot: m.Slot, discovered: facts.Discovery, pairing: candidates.Pairing | None, owned: set[str]
) -> list[Drift]:
    disk = discovered.disk_by_id(slot.nvme_device)
    if disk is None:
        proposed = pairing.disk.by_id if pairing and pairing.disk else None
        new = proposed if proposed not in owned else None
        return [
            Drift(
                slot.slot_index,
                DISK_MISSING,
                "nvme_device",
                slot.nvme_device,
                new,
                f"disk {slot.nvme_device} is gone" + (f"; discovery now proposes {new}" if new else ""),
            )
        ]
    out = _identity(slot, disk)
    if disk.os_disk:
        out.append(
            Drift(
                slot.slot_index,
                DISK_OS,
                "os_disk",
                False,
                True,
                f"{slot.nvme_device} ({disk.name}) now holds the OS",
            )
        )
    if disk.mounted:
        out.append(
            Drift(
                slot.slot_index,
                DISK_MOUNTED,
                "mounted",
                False,
                True,
                f"{slot.nvme_device} ({disk.name}) is mounted at {', '.join(disk.mountpoints)}",
            )
        )
    return out


def _identity(slot: m.Slot, disk: facts.NvmeNamespace) -> list[Drift]:
    if slot.nvme_identity is None:
        return []
    # The comparison the host's disk guard makes; discovery reads NVMe namespaces only,
    # so an approved loop device's backing file never matches here.
    approved = hostplans.DiskIdentity(**slot.nvme_identity.model_dump())
    seen = hostplans.DiskIdentity(size_bytes=disk.size_bytes, model=disk.model, serial=disk.serial, wwid=disk.wwid)
    differs = approved.differences(seen)
    if not differs:
        return []
    return [
        Drift(
            slot.slot_index,
            DISK_IDENTITY_CHANGED,
            "nvme_identity",
            " ".join(f"{f}={getattr(approved, f)}" for f in differs),
            " ".join(f"{f}={getattr(seen, f)}" for f in differs),
            f"{slot.nvme_device} now leads to {disk.name}, which is not the approved disk ("
            + ", ".join(f"{f} {getattr(approved, f)!r} -> {getattr(seen, f)!r}" for f in differs)
            + ")",
        )
    ]
