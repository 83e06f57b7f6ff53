"""The host plan: what the central reconciler asks one node to run.

Written by the central reconciler (one row per node, with a generation) and
read by that node's host reconciler only. Serialised as JSON in PostgreSQL
(`host_plans.spec`); `to_json`/`from_json` are the only codec.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

# Stable namespace so a VM's UUID is derived from its allocation id.
_VM_NAMESPACE = uuid.UUID("6f2a1d3e-7c1b-4e0a-9d52-3b8f0c4a9e11")


def vm_name(allocation_id: str) -> str:
    return f"gpuaas-{allocation_id}"


def vm_uuid(allocation_id: str) -> str:
    return str(uuid.uuid5(_VM_NAMESPACE, allocation_id))


@dataclass(frozen=True, slots=True)
class SlotBundle:
    slot_index: int
    gpu_pci_address: str
    fabric_vf_pci_address: str | None
    nvme_device: str  # approved /dev/disk/by-id path; never from a user
    mac_address: str
    private_ip: str
    numa_node: int


@dataclass(frozen=True, slots=True)
class ImageRef:
    slug: str
    source_ref: str
    digest_sha256: str | None
    image_format: str
    default_username: str = "ubuntu"


@dataclass(frozen=True, slots=True)
class VmSpec:
    allocation_id: str
    tenant: str
    bundles: tuple[SlotBundle, ...]
    vcpu_count: int
    memory_mib: int
    hugepages: bool = False
    hugepage_size: str | None = None
    image: ImageRef | None = None
    ssh_keys: tuple[str, ...] = ()
    claim_ids: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return vm_name(self.allocation_id)

    @property
    def uuid(self) -> str:
        return vm_uuid(self.allocation_id)


@dataclass(frozen=True, slots=True)
class Network:
    subnet: str
    gateway: str
    dhcp_start: str
    dhcp_end: str
    bridge: str


@dataclass(frozen=True, slots=True)
class HostPlan:
    node: str
    generation: int
    network: Network
    os_disk: str
    graceful_timeout_s: int = 120
    readiness_timeout_s: int = 300
    vms: tuple[VmSpec, ...] = ()  # allocations that must be running here
    releases: tuple[VmSpec, ...] = ()  # allocations to stop, clean and wipe
    # Every approved slot of the node (free ones too), for drift and wipe checks.
    slots: tuple[SlotBundle, ...] = field(default=())


def to_json(plan: HostPlan) -> dict[str, Any]:
    return asdict(plan)


def from_json(doc: dict[str, Any]) -> HostPlan:
    def bundle(d: dict[str, Any]) -> SlotBundle:
        return SlotBundle(**d)

    def vm(d: dict[str, Any]) -> VmSpec:
        d = dict(d)
        d["bundles"] = tuple(bundle(b) for b in d["bundles"])
        d["image"] = ImageRef(**d["image"]) if d.get("image") else None
        d["ssh_keys"] = tuple(d.get("ssh_keys", ()))
        d["claim_ids"] = tuple(d.get("claim_ids", ()))
        return VmSpec(**d)

    d = dict(doc)
    d["network"] = Network(**d["network"])
    d["vms"] = tuple(vm(v) for v in d.get("vms", ()))
    d["releases"] = tuple(vm(v) for v in d.get("releases", ()))
    d["slots"] = tuple(bundle(s) for s in d.get("slots", ()))
    return HostPlan(**d)
