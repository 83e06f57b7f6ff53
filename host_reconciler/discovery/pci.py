"""GPUs and RDMA fabric devices, enumerated from PCI sysfs.

GPUs are every PCI function whose vendor is NVIDIA (10de) or AMD (1002) and
whose class is a display controller (0x0300 VGA, 0x0302 3D, 0x0380 other) or
a processing accelerator (0x1200, how AMD Instinct parts enumerate). Fabric
devices are the physical functions behind `/sys/class/infiniband` plus every
Mellanox (15b3) network function, with their SR-IOV VFs from `virtfn*`
links. Nothing is looked up in a list of expected addresses: the model names
below only label what was found.
"""

from __future__ import annotations

import re

from host_reconciler.discovery import facts
from host_reconciler.discovery.sysfs import PCI_DEVICES, SysRoot

GPU_VENDORS = {"10de": "nvidia", "1002": "amd"}
GPU_CLASSES = frozenset({"0300", "0302", "0380", "1200"})
MELLANOX = "15b3"
NETWORK_CLASS = "02"
BRIDGE_CLASS = "06"

# Labels only: an unknown device id is still discovered, named vendor-device.
GPU_MODELS = {
    ("10de", "2330"): "h100",
    ("10de", "2331"): "h100-pcie",
    ("10de", "2321"): "h100-nvl",
    ("10de", "2335"): "h200",
    ("10de", "233b"): "h200-nvl",
    ("10de", "2901"): "b200",
    ("1002", "74a1"): "mi300x",
    ("1002", "74a5"): "mi325x",
}
FABRIC_MODELS = {
    "1017": "ConnectX-5",
    "101b": "ConnectX-6",
    "101d": "ConnectX-6 Dx",
    "1021": "ConnectX-7",
    "1023": "ConnectX-8",
    "a2d6": "BlueField-2",
    "a2dc": "BlueField-3",
}
_VIRTFN = re.compile(r"^virtfn(\d+)$")


def _hex(value: str | None) -> str:
    """ "0x10de\\n" -> "10de"; missing -> ""."""
    return (value or "").lower().removeprefix("0x")


def _numa(value: int | None) -> int | None:
    return None if value is None or value < 0 else value


class PciReader:
    """One pass over PCI sysfs; `gpus()` and `fabric()` read details on demand."""

    def __init__(self, sr: SysRoot) -> None:
        self.sr = sr
        self.classes: dict[str, str] = {}
        self.vendors: dict[str, str] = {}
        for addr in sr.listdir(PCI_DEVICES):
            base = f"{PCI_DEVICES}/{addr}"
            self.classes[addr] = _hex(sr.read(f"{base}/class"))
            self.vendors[addr] = _hex(sr.read(f"{base}/vendor"))
        self.ib_by_pci: dict[str, str] = {}
        for ibdev in sr.listdir("sys/class/infiniband"):
            pci_addr = sr.link_name(f"sys/class/infiniband/{ibdev}/device")
            if pci_addr is not None:
                self.ib_by_pci.setdefault(pci_addr, ibdev)

    def _attr(self, addr: str, name: str) -> str | None:
        return self.sr.read(f"{PCI_DEVICES}/{addr}/{name}")

    def _int(self, addr: str, name: str) -> int | None:
        return self.sr.read_int(f"{PCI_DEVICES}/{addr}/{name}")

    def _link(self, addr: str, name: str) -> str | None:
        return self.sr.link_name(f"{PCI_DEVICES}/{addr}/{name}")

    def _group(self, addr: str) -> int | None:
        name = self._link(addr, "iommu_group")
        return int(name) if name is not None and name.isdigit() else None

    def path(self, addr: str) -> tuple[str, ...]:
        return self.sr.device_path(f"{PCI_DEVICES}/{addr}")

    def numa_node(self, addr: str) -> int | None:
        return _numa(self._int(addr, "numa_node"))

    # ------------------------------------------------------------------ GPUs

    def gpus(self) -> tuple[facts.Gpu, ...]:
        out = []
        for addr, cls in self.classes.items():
            vendor = self.vendors[addr]
            if vendor not in GPU_VENDORS or cls[:4] not in GPU_CLASSES:
                continue
            device = _hex(self._attr(addr, "device"))
            group = self._group(addr)
            out.append(
                facts.Gpu(
                    pci_address=addr,
                    vendor=vendor,
                    device=device,
                    pci_class=cls,
                    model=GPU_MODELS.get((vendor, device), f"{GPU_VENDORS[vendor]}-{device or 'unknown'}"),
                    numa_node=self.numa_node(addr),
                    iommu_group=group,
                    iommu_group_peers=self._group_peers(addr, group),
                    driver=self._link(addr, "driver"),
                    pci_path=self.path(addr),
                )
            )
        return tuple(out)

    def _group_peers(self, addr: str, group: int | None) -> tuple[str, ...]:
        """Other endpoints sharing the IOMMU group: they would pass through with the GPU."""
        if group is None:
            return ()
        members = self.sr.listdir(f"sys/kernel/iommu_groups/{group}/devices")
        return tuple(m for m in members if m != addr and not self.classes.get(m, "").startswith(BRIDGE_CLASS))

    # ---------------------------------------------------------------- fabric

    def fabric(self) -> tuple[facts.FabricDevice, ...]:
        out = []
        for addr, cls in self.classes.items():
            is_rdma = addr in self.ib_by_pci
            is_mlx_net = self.vendors[addr] == MELLANOX and cls.startswith(NETWORK_CLASS)
            if not (is_rdma or is_mlx_net) or self.sr.exists(f"{PCI_DEVICES}/{addr}/physfn"):
                continue
            out.append(self._fabric_device(addr))
        return tuple(out)

    def _fabric_device(self, addr: str) -> facts.FabricDevice:
        vendor = self.vendors[addr]
        device = _hex(self._attr(addr, "device"))
        ibdev = self.ib_by_pci.get(addr)
        ports: tuple[facts.FabricPort, ...] = ()
        guid = None
        if ibdev is not None:
            guid = self.sr.read(f"sys/class/infiniband/{ibdev}/node_guid")
            ports = self._ports(ibdev)
        model = FABRIC_MODELS.get(device) if vendor == MELLANOX else None
        return facts.FabricDevice(
            pci_address=addr,
            vendor=vendor,
            device=device,
            model=model or f"{vendor}-{device}",
            ib_device=ibdev,
            node_guid=guid,
            ports=ports,
            numa_node=self.numa_node(addr),
            driver=self._link(addr, "driver"),
            sriov_totalvfs=self._int(addr, "sriov_totalvfs"),
            sriov_numvfs=self._int(addr, "sriov_numvfs"),
            vfs=self._vfs(addr),
            pci_path=self.path(addr),
        )

    def _ports(self, ibdev: str) -> tuple[facts.FabricPort, ...]:
        base = f"sys/class/infiniband/{ibdev}/ports"
        out = []
        for name in self.sr.listdir(base):
            if not name.isdigit():
                continue
            state = self.sr.read(f"{base}/{name}/state") or ""
            phys = self.sr.read(f"{base}/{name}/phys_state")
            out.append(
                facts.FabricPort(
                    port=int(name),
                    state=state.split(":", 1)[-1].strip(),
                    phys_state=phys.split(":", 1)[-1].strip() if phys else None,
                    link_layer=self.sr.read(f"{base}/{name}/link_layer") or "",
                    rate=self.sr.read(f"{base}/{name}/rate"),
                )
            )
        return tuple(sorted(out, key=lambda p: p.port))

    def _vfs(self, parent: str) -> tuple[facts.VirtualFunction, ...]:
        out = []
        for name in self.sr.listdir(f"{PCI_DEVICES}/{parent}"):
            match = _VIRTFN.match(name)
            if match is None:
                continue
            addr = self._link(parent, name)
            if addr is None:
                continue
            out.append(
                facts.VirtualFunction(
                    pci_address=addr,
                    index=int(match.group(1)),
                    parent=parent,
                    driver=self._link(addr, "driver"),
                    iommu_group=self._group(addr),
                    ib_device=self.ib_by_pci.get(addr),
                    pci_path=self.path(addr),
                )
            )
        return tuple(sorted(out, key=lambda v: v.index))
