"""Discovery -> candidate SlotMap: pair each GPU with a fabric VF and a disk.

Pure: no I/O. The candidate is a SlotMap document in the approved schema with
`approval_required: true` and per-slot `blockers`; discovery never writes an
approved map. An operator reviews it, resolves or drops blocked slots,
deletes `approval_required` and merges it through a pull request.

Pairing, in a stable order:

1. GPUs are numbered by (NUMA node, PCI address): slot 0 is the lowest
   address on NUMA node 0.
2. Each GPU, in slot order, takes the free SR-IOV VF that is NUMA-local and
   nearest in the PCIe tree (longest shared chain of bridges, so the NIC
   under the GPU's own switch wins), then the least used parent, then the
   lowest parent address and virtfn index. No NUMA-local VF: a remote one,
   with `fabric.numa_remote`. No VF at all: the nearest parent device, with
   `fabric.no_vf`, and `fabric.shared_parent` when slots share it.
3. Each GPU then takes a free NVMe namespace the same way (NUMA-local,
   nearest, then one with no blocker, then controller address). The OS disk
   is used only when nothing else is left, and carries `disk.os_disk`.
4. MAC = 52:54 + the first 4 bytes of sha256("<node>:<slot_index>"); IP =
   the management network's DHCP start + slot_index (10.100.0.10 + slot).
5. Each slot records its disk's identity as sysfs reports it
   (`nvme_identity`: model, serial, wwid, size_bytes), so the approval names
   the physical disk and not only a by-id link: the host refuses to write a
   disk whose identity differs, and the gate reports it. A value the schema
   cannot hold (non-ASCII, a wwid of an unknown form) is left out, never
   guessed; a disk with neither serial nor wwid gets no identity.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from desired import models as m
from host_reconciler import codes as host_codes
from host_reconciler.discovery import blockers as b
from host_reconciler.discovery import facts
from schemas.errors import PermanentError

DEFAULT_WIPE_POLICY = "wipefs-blkdiscard-verify"
NODE_INVALID = host_codes.DISCOVERY_NODE_INVALID
_NAME = re.compile(m.NAME_RE)
_SYSFS_TEXT = re.compile(m.SYSFS_TEXT_RE)
_WWID = re.compile(m.WWID_RE)


@dataclass(frozen=True, slots=True)
class Pairing:
    """One GPU and what discovery proposes to bundle with it."""

    slot_index: int
    gpu: facts.Gpu
    vf: facts.VirtualFunction | None
    fabric: facts.FabricDevice | None  # the VF's parent, or the device shared without a VF
    disk: facts.NvmeNamespace | None
    blockers: tuple[m.Blocker, ...]


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    slot_map: m.SlotMap | None  # None when the host has no GPU (or no GPU with a disk)
    pairings: tuple[Pairing, ...]
    spare_vfs: tuple[str, ...]  # VFs no slot took
    spare_disks: tuple[str, ...]  # by-id paths no slot took


def mac_address(node: str, slot_index: int) -> str:
    digest = hashlib.sha256(f"{node}:{slot_index}".encode()).hexdigest()
    return "52:54:" + ":".join(digest[i : i + 2] for i in range(0, 8, 2))


def private_ip(network: m.ManagementNetwork, slot_index: int) -> str:
    return str(ipaddress.ip_address(network.dhcp_range.start) + slot_index)


def slot_numa(numa_node: int | None) -> int:
    """A kernel reporting no NUMA node (-1) has one node: call it 0."""
    return 0 if numa_node is None else numa_node


def closeness(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """How many bridges two PCI functions share above them (0: different root complexes)."""
    n = 0
    for x, y in zip(a[:-1], b[:-1], strict=False):
        if x != y:
            break
        n += 1
    return n


def _local(gpu: facts.Gpu, numa: int | None) -> bool:
    return gpu.numa_node is None or numa is None or gpu.numa_node == numa


def _blocker(code: str, message: str) -> m.Blocker:
    return m.Blocker(code=code, message=message)


def host_blockers(discovery: facts.Discovery) -> list[m.Blocker]:
    return [
        _blocker(b.HOST[p.name], p.detail)
        for p in discovery.prerequisites
        if p.required and not p.ok and p.name in b.HOST
    ]


def gpu_blockers(gpu: facts.Gpu) -> list[m.Blocker]:
    out = []
    if not gpu.vfio:
        out.append(
            _blocker(
                b.GPU_NOT_VFIO,
                f"GPU {gpu.pci_address} is bound to {gpu.driver or 'no driver'}, not vfio-pci",
            )
        )
    if gpu.iommu_group is None:
        out.append(_blocker(b.GPU_NO_IOMMU_GROUP, f"GPU {gpu.pci_address} has no IOMMU group"))
    elif gpu.iommu_group_peers:
        out.append(
            _blocker(
                b.GPU_IOMMU_GROUP_SHARED,
                f"IOMMU group {gpu.iommu_group} of GPU {gpu.pci_address} also holds {', '.join(gpu.iommu_group_peers)}",
            )
        )
    return out


def disk_blockers(disk: facts.NvmeNamespace) -> list[m.Blocker]:
    ident = disk.by_id or disk.name
    out = []
    if disk.os_disk:
        out.append(_blocker(b.DISK_OS, f"{ident} ({disk.name}) holds the OS; never a slot disk"))
    if disk.mounted:
        out.append(_blocker(b.DISK_MOUNTED, f"{ident} ({disk.name}) is mounted at {', '.join(disk.mountpoints)}"))
    if disk.holders:
        out.append(_blocker(b.DISK_IN_USE, f"{ident} ({disk.name}) is held by {', '.join(disk.holders)}"))
    if not disk.signature_checked:
        out.append(
            _blocker(
                b.DISK_SIGNATURE_UNCHECKED,
                f"the header of {disk.name} could not be read; its signature state is unknown",
            )
        )
    elif disk.signature:
        out.append(_blocker(b.DISK_SIGNATURE, f"{ident} ({disk.name}) carries a signature: {disk.signature}"))
    return out


def port_blockers(pf: facts.FabricDevice | None) -> list[m.Blocker]:
    if pf is None or not pf.ports or pf.ports_active:
        return []
    down = ", ".join(f"{p.port} {p.state}" for p in pf.ports if not p.active)
    return [_blocker(b.FABRIC_PORT_DOWN, f"{pf.ib_device or pf.pci_address} port {down}")]


def _pick_fabric(
    gpu: facts.Gpu, fabric: tuple[facts.FabricDevice, ...], used: set[str], parent_use: Counter[str]
) -> tuple[facts.VirtualFunction | None, facts.FabricDevice | None, list[m.Blocker]]:
    free = [(pf, vf) for pf in fabric for vf in pf.vfs if vf.pci_address not in used]
    local = [(pf, vf) for pf, vf in free if _local(gpu, pf.numa_node)]
    pool = local or free
    out: list[m.Blocker] = []
    if pool:
        pf, vf = min(
            pool,
            key=lambda x: (
                -closeness(gpu.pci_path, x[1].pci_path or x[0].pci_path),
                parent_use[x[0].pci_address],
                x[0].pci_address,
                x[1].index,
            ),
        )
        if not local:
            out.append(
                _blocker(
                    b.FABRIC_NUMA_REMOTE,
                    f"no free VF on NUMA node {gpu.numa_node}; VF {vf.pci_address} is on node {pf.numa_node}",
                )
            )
        if not vf.vfio:
            out.append(
                _blocker(
                    b.FABRIC_VF_NOT_VFIO,
                    f"VF {vf.pci_address} is bound to {vf.driver or 'no driver'}, not vfio-pci",
                )
            )
        return vf, pf, out
    if not fabric:
        return None, None, [_blocker(b.FABRIC_NO_VF, "no RDMA fabric device found on this host")]
    near = [pf for pf in fabric if _local(gpu, pf.numa_node)]
    pf = min(near or fabric, key=lambda f: (-closeness(gpu.pci_path, f.pci_path), f.pci_address))
    out.append(
        _blocker(
            b.FABRIC_NO_VF,
            f"fabric device {pf.pci_address} has no free SR-IOV VF "
            f"(sriov_numvfs {pf.sriov_numvfs if pf.sriov_numvfs is not None else 'unknown'})",
        )
    )
    if not near:
        out.append(
            _blocker(
                b.FABRIC_NUMA_REMOTE,
                f"fabric device {pf.pci_address} is on NUMA node {pf.numa_node}, GPU on {gpu.numa_node}",
            )
        )
    return None, pf, out


def _pick_disk(
    gpu: facts.Gpu, nvme: tuple[facts.NvmeNamespace, ...], used: set[str]
) -> tuple[facts.NvmeNamespace | None, list[m.Blocker]]:
    free = [d for d in nvme if d.by_id and d.name not in used]
    data = [d for d in free if not d.os_disk]
    local = [d for d in data if _local(gpu, d.numa_node)]
    pool = local or data or free
    if not pool:
        return None, [_blocker(b.DISK_NONE, f"no free NVMe namespace left for GPU {gpu.pci_address}")]
    disk = min(
        pool,
        key=lambda d: (
            -closeness(gpu.pci_path, d.pci_path),
            bool(disk_blockers(d)),
            d.controller_pci_address or "",
            d.name,
        ),
    )
    out = disk_blockers(disk)
    if not _local(gpu, disk.numa_node):
        out.append(
            _blocker(
                b.DISK_NUMA_REMOTE,
                f"{disk.by_id} is on NUMA node {disk.numa_node}, GPU on {gpu.numa_node}",
            )
        )
    return disk, out


def pairings(discovery: facts.Discovery) -> tuple[Pairing, ...]:
    gpus = sorted(discovery.gpus, key=lambda g: (slot_numa(g.numa_node), g.pci_address))
    host = host_blockers(discovery)
    used_vfs: set[str] = set()
    used_disks: set[str] = set()
    parent_use: Counter[str] = Counter()
    picked: list[
        tuple[
            int,
            facts.Gpu,
            facts.VirtualFunction | None,
            facts.FabricDevice | None,
            facts.NvmeNamespace | None,
            list[m.Blocker],
        ]
    ] = []
    for i, gpu in enumerate(gpus):
        vf, pf, fabric_out = _pick_fabric(gpu, discovery.fabric, used_vfs, parent_use)
        disk, disk_out = _pick_disk(gpu, discovery.nvme, used_disks)
        if vf is not None:
            used_vfs.add(vf.pci_address)
        if pf is not None:
            parent_use[pf.pci_address] += 1
        if disk is not None:
            used_disks.add(disk.name)
        found = [*host, *gpu_blockers(gpu), *fabric_out, *port_blockers(pf), *disk_out]
        picked.append((i, gpu, vf, pf, disk, found))
    # A parent device handed to several slots without VFs is not concurrency proof (seed 003).
    bare = Counter(pf.pci_address for _, _, vf, pf, _, _ in picked if vf is None and pf is not None)
    out = []
    for i, gpu, vf, pf, disk, found in picked:
        if vf is None and pf is not None and bare[pf.pci_address] > 1:
            found.append(
                _blocker(
                    b.FABRIC_SHARED_PARENT,
                    f"fabric device {pf.pci_address} is shared by "
                    "several slots without per-slot VFs; not concurrency proof",
                )
            )
        out.append(Pairing(i, gpu, vf, pf, disk, tuple(found)))
    return tuple(out)


def nvme_identity(disk: facts.NvmeNamespace) -> dict[str, Any] | None:
    """The `nvme_identity` a slot records for `disk` (point 5 of the module docstring)."""
    found: dict[str, Any] = {}
    for key, value, pattern in (
        ("model", disk.model, _SYSFS_TEXT),
        ("serial", disk.serial, _SYSFS_TEXT),
        ("wwid", disk.wwid, _WWID),
    ):
        if value and pattern.match(value):
            found[key] = value
    if not ({"serial", "wwid"} & set(found)) or disk.size_bytes < m.SECTOR_BYTES:
        return None
    found["size_bytes"] = disk.size_bytes
    return found


def _slot(
    p: Pairing,
    disk: facts.NvmeNamespace,
    by_id: str,
    *,
    node: str,
    group_index: int,
    network: m.ManagementNetwork,
    wipe_policy: str,
) -> dict[str, Any]:
    shared = any(x.code == b.FABRIC_SHARED_PARENT for x in p.blockers)
    numa = slot_numa(p.gpu.numa_node)
    slot: dict[str, Any] = {
        "slot_index": p.slot_index,
        "gpu_pci_address": p.gpu.pci_address,
        "gpu_model": p.gpu.model,
        "numa_node": numa,
        "slot_group": f"numa{numa}",
        "pcie_pair": f"numa{numa}-pair{group_index // 2}",
        "nvme_device": by_id,
        "network_fabric": p.fabric.fabric if p.fabric is not None else "none",
    }
    identity = nvme_identity(disk)
    if identity is not None:
        slot["nvme_identity"] = identity
    if p.vf is not None:
        slot["fabric_vf_pci_address"] = p.vf.pci_address
    if p.fabric is not None:
        slot["fabric_parent_device"] = p.fabric.pci_address
        slot["fabric_claim_mode"] = (
            "per_slot_vf" if p.vf is not None else "shared_host" if shared else "exclusive_device"
        )
    slot["mac_address"] = mac_address(node, p.slot_index)
    slot["private_ip"] = private_ip(network, p.slot_index)
    ownership = "host" if disk.os_disk else "share" if disk.mounted else "slice"
    slot["capacity_metadata"] = {"storage_ownership": ownership}
    if ownership == "slice":
        slot["capacity_metadata"]["destructive_wipe_policy"] = wipe_policy
    slot["blockers"] = [{"code": x.code, "message": x.message} for x in p.blockers]
    return slot


def candidate_map(
    discovery: facts.Discovery,
    *,
    node: str,
    network: m.ManagementNetwork | None = None,
    wipe_policy: str = DEFAULT_WIPE_POLICY,
) -> Candidate:
    """The candidate SlotMap for `node` (approval_required: true), with its evidence."""
    if not _NAME.match(node):
        raise PermanentError(
            f"node name {node!r} is not a valid name (lowercase letters, digits, '.', '_' or '-'); pass --node NAME",
            code=NODE_INVALID,
        )
    net = network or m.ManagementNetwork()
    paired = pairings(discovery)
    groups: Counter[int] = Counter()
    slots = []
    for p in paired:
        if p.disk is None or p.disk.by_id is None:
            continue  # no disk left for this GPU: reported in the evidence, not mappable
        numa = slot_numa(p.gpu.numa_node)
        slots.append(
            _slot(
                p,
                p.disk,
                p.disk.by_id,
                node=node,
                group_index=groups[numa],
                network=net,
                wipe_policy=wipe_policy,
            )
        )
        groups[numa] += 1
    slot_map = None
    if slots:
        slot_map = m.SlotMap.model_validate(
            {
                "apiVersion": m.API_VERSION,
                "kind": "SlotMap",
                "node": node,
                "approval_required": True,
                "slots": slots,
            }
        )
    used_vfs = {p.vf.pci_address for p in paired if p.vf is not None}
    used_disks = {p.disk.name for p in paired if p.disk is not None}
    return Candidate(
        node=node,
        slot_map=slot_map,
        pairings=paired,
        spare_vfs=tuple(v.pci_address for f in discovery.fabric for v in f.vfs if v.pci_address not in used_vfs),
        spare_disks=_names(d for d in discovery.nvme if d.name not in used_disks),
    )


def _names(disks: Iterable[facts.NvmeNamespace]) -> tuple[str, ...]:
    return tuple(d.by_id or d.name for d in disks)
