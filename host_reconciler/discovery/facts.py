"""What discovery saw on one host: plain, frozen values with no I/O attached.

These are the facts the candidate builder (`candidates`) and the approval
gate (`gating`) reason about. Readers (`pci`, `disks`, `hosts`) produce them
from a sysfs root; tests may build them by hand. Every field is something the
kernel reports; nothing here is inferred from a device list or a GPU count.

`Discovery.as_dict()` is the JSON shape of `gpuaas host discover -o json`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

VFIO_DRIVER = "vfio-pci"


class LinkLayer(enum.StrEnum):
    """`ports/N/link_layer` as the kernel spells it."""

    INFINIBAND = "InfiniBand"
    ETHERNET = "Ethernet"


@dataclass(frozen=True, slots=True)
class Gpu:
    pci_address: str
    vendor: str  # "10de", "1002"
    device: str  # "2335"
    pci_class: str  # "030200"
    model: str  # "h200", or "nvidia-2335" when the device id has no known name
    numa_node: int | None  # None where the kernel reports -1
    iommu_group: int | None
    iommu_group_peers: tuple[str, ...]  # other non-bridge functions in the same group
    driver: str | None
    pci_path: tuple[str, ...]  # ancestors under /sys/devices, root complex first

    @property
    def vfio(self) -> bool:
        return self.driver == VFIO_DRIVER


@dataclass(frozen=True, slots=True)
class FabricPort:
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", ... (the word after "4: ")
    phys_state: str | None  # "LinkUp", "Disabled", ...
    link_layer: str  # LinkLayer value, or whatever the kernel wrote
    rate: str | None

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True, slots=True)
class VirtualFunction:
    pci_address: str
    index: int  # N of the parent's virtfnN link: SR-IOV order, not address order
    parent: str  # PCI address of the physical function
    driver: str | None
    iommu_group: int | None
    ib_device: str | None  # present only while the VF is bound to a host RDMA driver
    pci_path: tuple[str, ...]

    @property
    def vfio(self) -> bool:
        return self.driver == VFIO_DRIVER


@dataclass(frozen=True, slots=True)
class FabricDevice:
    """A physical function with RDMA (InfiniBand or RoCE) capability."""

    pci_address: str
    vendor: str
    device: str
    model: str  # "ConnectX-7", "BlueField-3", or "15b3-1021"
    ib_device: str | None  # "mlx5_0"
    node_guid: str | None
    ports: tuple[FabricPort, ...]
    numa_node: int | None
    driver: str | None
    sriov_totalvfs: int | None
    sriov_numvfs: int | None
    vfs: tuple[VirtualFunction, ...]
    pci_path: tuple[str, ...]

    @property
    def link_layer(self) -> str | None:
        return self.ports[0].link_layer if self.ports else None

    @property
    def fabric(self) -> str:
        """The slot vocabulary: infiniband, roce (Ethernet link layer) or none."""
        layer = self.link_layer
        if layer == LinkLayer.INFINIBAND:
            return "infiniband"
        if layer == LinkLayer.ETHERNET:
            return "roce"
        return "none"

    @property
    def ports_active(self) -> bool:
        return bool(self.ports) and all(p.active for p in self.ports)


@dataclass(frozen=True, slots=True)
class NvmeNamespace:
    name: str  # kernel name, "nvme0n1": volatile, never the identity
    by_id: str | None  # preferred stable /dev/disk/by-id path
    by_id_aliases: tuple[str, ...]  # every by-id path that names this namespace
    model: str | None
    serial: str | None
    wwid: str | None
    controller_pci_address: str | None
    numa_node: int | None
    size_bytes: int
    partitions: tuple[str, ...]
    mountpoints: tuple[str, ...]  # of the namespace itself or any partition
    holders: tuple[str, ...]  # dm/md devices stacked on it or its partitions
    signature: str | None  # "gpt", "dos", "ext4", "xfs", ... ; None: none found
    signature_checked: bool  # False when the header could not be read
    os_disk: bool
    pci_path: tuple[str, ...]

    @property
    def mounted(self) -> bool:
        return bool(self.mountpoints)


@dataclass(frozen=True, slots=True)
class Hugepages:
    size_kib: int
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class NumaNode:
    node: int
    cpus: tuple[int, ...]
    cpulist: str
    memory_kib: int | None
    hugepages: tuple[Hugepages, ...]


@dataclass(frozen=True, slots=True)
class Prerequisite:
    name: str  # "iommu", "kvm", "vfio_pci", "libvirt", "ovs", "reboot", "hugepages"
    ok: bool
    detail: str
    required: bool = True  # False: reported for the operator, never a slot blocker


@dataclass(frozen=True, slots=True)
class BlockDevice:
    """A non-NVMe disk that matters anyway (the OS disk of a VM-hosted node)."""

    name: str
    by_id: str | None


@dataclass(frozen=True, slots=True)
class Discovery:
    hostname: str | None
    kernel: str | None
    cmdline: str
    gpus: tuple[Gpu, ...]
    fabric: tuple[FabricDevice, ...]
    nvme: tuple[NvmeNamespace, ...]
    os_disks: tuple[BlockDevice, ...]  # the disk(s) holding / (and /boot, /usr, /var)
    numa_nodes: tuple[NumaNode, ...]
    hugepages: tuple[Hugepages, ...]
    prerequisites: tuple[Prerequisite, ...]

    @property
    def reboot_required(self) -> bool:
        return any(p.name == "reboot" and not p.ok for p in self.prerequisites)

    def gpu(self, pci_address: str) -> Gpu | None:
        return next((g for g in self.gpus if g.pci_address == pci_address), None)

    def vf(self, pci_address: str) -> VirtualFunction | None:
        return next((v for f in self.fabric for v in f.vfs if v.pci_address == pci_address), None)

    def fabric_device(self, pci_address: str) -> FabricDevice | None:
        return next((f for f in self.fabric if f.pci_address == pci_address), None)

    def disk_by_id(self, path: str) -> NvmeNamespace | None:
        return next((d for d in self.nvme if path in d.by_id_aliases), None)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["reboot_required"] = self.reboot_required
        return out
