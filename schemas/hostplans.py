"""The host plan: what the central reconciler asks one node to run.

Written by the central reconciler (one row per node, with a generation) and
read by that node's host reconciler only. Serialised as JSON in PostgreSQL
(`host_plans.spec`); `to_json`/`from_json` are the only codec.

Compatibility: a field added later is optional and left out of the JSON while
it has no value (`disk_identities`, `ingress`), so a plan without it is byte-for-byte the
plan an older writer made (no generation bump on upgrade) and an older host
can still read it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# Stable namespace so a VM's UUID is derived from its allocation id.
_VM_NAMESPACE = uuid.UUID("6f2a1d3e-7c1b-4e0a-9d52-3b8f0c4a9e11")


def vm_name(allocation_id: str) -> str:
    return f"gpuaas-{allocation_id}"


def vm_uuid(allocation_id: str) -> str:
    return str(uuid.uuid5(_VM_NAMESPACE, allocation_id))


IDENTITY_FIELDS = ("model", "serial", "wwid", "size_bytes", "backing_file")


@dataclass(frozen=True, slots=True)
class DiskIdentity:
    """A slot disk's approved identity (SlotMap `nvme_identity`), as sysfs spells it.

    Fields left None were not recorded and are not compared; `size_bytes` always is.
    """

    size_bytes: int
    model: str | None = None
    serial: str | None = None
    wwid: str | None = None
    backing_file: str | None = None  # a loop device (lab hosts)

    def as_dict(self) -> dict[str, Any]:
        """The recorded fields only (the JSON of the plan and of evidence), in field order.

        Read field by field: `dataclasses.asdict` deep-copies, and this runs for every slot of every plan.
        """
        out: dict[str, Any] = {"size_bytes": self.size_bytes}
        for name in IDENTITY_FIELDS:
            value = getattr(self, name)
            if value is not None and name != "size_bytes":
                out[name] = value
        return out

    def differences(self, seen: DiskIdentity) -> list[str]:
        """The fields this (approved) identity records that `seen` does not match, in a fixed order."""
        return [f for f in IDENTITY_FIELDS if getattr(self, f) is not None and getattr(self, f) != getattr(seen, f)]

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> DiskIdentity | None:
        if not doc:
            return None
        return cls(
            size_bytes=int(doc["size_bytes"]),
            model=_opt_str(doc.get("model")),
            serial=_opt_str(doc.get("serial")),
            wwid=_opt_str(doc.get("wwid")),
            backing_file=_opt_str(doc.get("backing_file")),
        )


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


@dataclass(frozen=True, slots=True)
class SlotIdentity:
    """The approved identity of one slot's disk.

    Kept beside `HostPlan.slots`, not in the bundles: a bundle shapes the
    domain and its spec digest, the identity only guards the disk.
    """

    slot_index: int
    nvme_identity: DiskIdentity


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
    # From the claim snapshot (VM profile, else SKU); None: the plan's Fleet-wide readiness_timeout_s.
    readiness_timeout_s: int | None = None

    @property
    def name(self) -> str:
        return vm_name(self.allocation_id)

    @property
    def uuid(self) -> str:
        return vm_uuid(self.allocation_id)


@dataclass(frozen=True, slots=True)
class IngressRule:
    """One public endpoint of a slice VM: public_address:public_port -> private_ip:guest_port (TCP).

    Chosen by the central reconciler at placement (allocation_endpoints) and
    realised by the host as a DNAT rule and a forward rule; `guest_port` 22 is
    the allocation's SSH endpoint, others its extra ports.
    """

    allocation_id: str
    public_address: str
    public_port: int
    private_ip: str
    guest_port: int = 22


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
    # Seconds a released VM gets to shut down gracefully before it is stopped hard (the Fleet's
    # graceful_shutdown_timeout_s). On the wire under its first name, `graceful_timeout_s` (WIRE_NAMES).
    shutdown_timeout_s: int = 120
    readiness_timeout_s: int = 300
    vms: tuple[VmSpec, ...] = ()  # allocations that must be running here
    releases: tuple[VmSpec, ...] = ()  # allocations to stop, clean and wipe
    # Every approved slot of the node (free ones too), for drift and wipe checks.
    slots: tuple[SlotBundle, ...] = field(default=())
    # The approved disk identity of the slots whose SlotMap records one.
    disk_identities: tuple[SlotIdentity, ...] = ()
    # sha256 hex digests the catalog pins (Image.cache_pinned): never evicted from this host's cache.
    pinned_images: tuple[str, ...] = ()
    # Public endpoints of the VMs of `vms` (left out of the JSON while empty).
    ingress: tuple[IngressRule, ...] = ()

    def nvme_identity(self, slot_index: int) -> DiskIdentity | None:
        return next((i.nvme_identity for i in self.disk_identities if i.slot_index == slot_index), None)


def readiness_timeout(plan: HostPlan, vm: VmSpec) -> int:
    """Seconds `vm` has to pass readiness: its own (VM profile > SKU, snapshotted), else the Fleet's."""
    return vm.readiness_timeout_s if vm.readiness_timeout_s is not None else plan.readiness_timeout_s


# Fields whose JSON key kept its first name: plans already stored, and host agents not yet upgraded,
# read the same bytes (a renamed key would change every plan's bytes and break older agents).
WIRE_NAMES = {"shutdown_timeout_s": "graceful_timeout_s"}


def _flat(obj: Any) -> dict[str, Any]:
    """A dataclass of plain values as a dict, fields in order (what `asdict` gives, without its deep copy)."""
    return {name: getattr(obj, name) for name in _FIELDS[type(obj)]}


def _vm_json(vm: VmSpec) -> dict[str, Any]:
    doc = _flat(vm)
    doc["bundles"] = tuple(_flat(b) for b in vm.bundles)
    doc["image"] = _flat(vm.image) if vm.image is not None else None
    if vm.readiness_timeout_s is None:  # unset stays out: plans of VMs without one keep their bytes
        del doc["readiness_timeout_s"]
    return doc


def to_json(plan: HostPlan) -> dict[str, Any]:
    """The plan's JSON document: `asdict` order and values, optional fields left out while empty.

    Built field by field: `dataclasses.asdict` deep-copies every value, and
    was most of the cost of writing 10,000 plans.
    """
    doc = {WIRE_NAMES.get(k, k): v for k, v in _flat(plan).items()}
    doc["network"] = _flat(plan.network)
    doc["vms"] = tuple(_vm_json(v) for v in plan.vms)
    doc["releases"] = tuple(_vm_json(v) for v in plan.releases)
    doc["slots"] = tuple(_flat(s) for s in plan.slots)
    doc["ingress"] = tuple(_flat(r) for r in plan.ingress)
    doc.pop("disk_identities")
    if not plan.ingress:
        doc.pop("ingress")
    if plan.disk_identities:
        doc["disk_identities"] = [
            {"slot_index": i.slot_index, "nvme_identity": i.nvme_identity.as_dict()} for i in plan.disk_identities
        ]
    return doc


def from_json(doc: dict[str, Any]) -> HostPlan:
    def bundle(d: dict[str, Any]) -> SlotBundle:
        return SlotBundle(**d)

    def identity(d: dict[str, Any]) -> SlotIdentity | None:
        found = DiskIdentity.from_dict(d.get("nvme_identity"))
        return SlotIdentity(int(d["slot_index"]), found) if found is not None else None

    def vm(d: dict[str, Any]) -> VmSpec:
        d = dict(d)
        d["bundles"] = tuple(bundle(b) for b in d["bundles"])
        d["image"] = ImageRef(**d["image"]) if d.get("image") else None
        d["ssh_keys"] = tuple(d.get("ssh_keys", ()))
        d["claim_ids"] = tuple(d.get("claim_ids", ()))
        return VmSpec(**d)

    d = dict(doc)
    for name, wire in WIRE_NAMES.items():
        if wire in d:
            d[name] = d.pop(wire)
    d["network"] = Network(**d["network"])
    d["vms"] = tuple(vm(v) for v in d.get("vms", ()))
    d["releases"] = tuple(vm(v) for v in d.get("releases", ()))
    d["slots"] = tuple(bundle(s) for s in d.get("slots", ()))
    d["disk_identities"] = tuple(i for i in map(identity, d.get("disk_identities", ())) if i is not None)
    d["pinned_images"] = tuple(str(x) for x in d.get("pinned_images", ()))
    d["ingress"] = tuple(
        IngressRule(
            allocation_id=str(r["allocation_id"]),
            public_address=str(r["public_address"]),
            public_port=int(r["public_port"]),
            private_ip=str(r["private_ip"]),
            guest_port=int(r.get("guest_port", 22)),
        )
        for r in d.get("ingress", ())
    )
    return HostPlan(**d)


_FIELDS: dict[type[Any], tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in (HostPlan, Network, VmSpec, SlotBundle, ImageRef, IngressRule)
}
