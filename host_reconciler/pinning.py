"""Host CPU/NUMA topology and the vCPU placement derived from it.

Seed 000 warns against copying the prototype's static cpuset lists (24 vCPUs
requested, 12 CPU ids listed): the CPU set of a slice VM is derived here from
the host topology, the node's approved slots and the VM's `vcpu_count`.

The rule is deterministic and needs no memory of other VMs, so a restarted
host reconciler derives the same pins and two VMs never overlap:

    cell n CPUs (hyperthread siblings adjacent), minus `reserved` host CPUs
    ┌────────────┬────────────┬────────────┬────────────┐
    │  slot 0    │  slot 1    │  slot 2    │  slot 3    │   equal shares, slot_index order
    └────────────┴────────────┴────────────┴────────────┘
    a VM holding slots 1 and 2 may pin its vCPUs to share(1) + share(2)

A VM spanning several NUMA nodes (8 GPUs) gets one guest NUMA cell per host
node, with vCPUs and memory split in proportion to its slots there.

Pure: parsing takes strings and lists, nothing here opens a connection.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass

from host_reconciler import codes as host_codes
from schemas.errors import PermanentError
from schemas.hostplans import SlotBundle, VmSpec

HUGEPAGE_KIB = {"1G": 1048576, "2M": 2048}


class TopologyError(PermanentError):
    code = host_codes.TOPOLOGY_INVALID


@dataclass(frozen=True, slots=True)
class Cell:
    id: int
    cpus: tuple[int, ...]  # ordered by (socket, core, id): siblings adjacent
    memory_kib: int = 0
    pages: tuple[tuple[int, int], ...] = ()  # (page size KiB, total pages)

    def page_count(self, size_kib: int) -> int:
        return dict(self.pages).get(size_kib, 0)


@dataclass(frozen=True, slots=True)
class HostTopology:
    cells: tuple[Cell, ...]
    # capabilities: libvirt's NUMA cells (pages are totals); node-info: an even split of
    # virNodeGetInfo (no pages); discovery: sysfs via host_reconciler.discovery (pages free)
    source: str = "capabilities"

    def cell(self, node: int) -> Cell:
        for c in self.cells:
            if c.id == node:
                return c
        raise TopologyError(
            f"NUMA node {node} is not on this host (cells: {[c.id for c in self.cells]})",
            code=host_codes.TOPOLOGY_NUMA_NODE_MISSING,
        )


@dataclass(frozen=True, slots=True)
class GuestCell:
    host_node: int
    vcpus: tuple[int, ...]  # guest vCPU ids
    memory_mib: int


@dataclass(frozen=True, slots=True)
class CpuPlacement:
    pins: tuple[int, ...]  # pins[v] = host CPU of guest vCPU v
    nodeset: tuple[int, ...]  # host NUMA nodes the VM's memory is bound to
    guest_cells: tuple[GuestCell, ...]  # empty when the VM sits on one node

    @property
    def cpuset(self) -> str:
        return format_cpuset(self.pins)


def from_capabilities(xml: str) -> HostTopology:
    """Parse `virConnectGetCapabilities()`; cells may be empty (test driver with a node file)."""
    root = ET.fromstring(xml)  # noqa: S314 -- libvirt's own output, not user input
    cells: list[Cell] = []
    for cell in root.findall("./host/topology/cells/cell"):
        cpus = sorted(
            (
                (
                    int(c.get("socket_id", "0")),
                    int(c.get("core_id", c.get("id", "0"))),
                    int(c.get("id", "0")),
                )
                for c in cell.findall("./cpus/cpu")
            ),
        )
        mem = cell.find("memory")
        memory_kib = int(mem.text or 0) if mem is not None else 0
        if mem is not None and mem.get("unit", "KiB") != "KiB":
            raise TopologyError(f"unexpected memory unit {mem.get('unit')!r} in capabilities")
        pages = tuple(
            (int(p.get("size", "0")), int(p.text or 0)) for p in cell.findall("pages") if p.get("unit", "KiB") == "KiB"
        )
        cells.append(Cell(int(cell.get("id", "0")), tuple(c[2] for c in cpus), memory_kib, pages))
    return HostTopology(tuple(sorted(cells, key=lambda c: c.id)))


def from_node_info(info: Sequence[object]) -> HostTopology:
    """Derive cells from `virNodeGetInfo()` when the driver reports none.

    The libvirt test driver reads CPUs, sockets, cores, threads and NUMA node
    counts from a `test:///path/node.xml` file but builds no capability
    cells from it; Linux numbers CPUs node by node, so an even split is what
    such a host would report.
    """
    memory_mib, cpus, nodes = int(str(info[1])), int(str(info[2])), max(int(str(info[4])), 1)
    if cpus % nodes:
        raise TopologyError(f"{cpus} CPUs do not split over {nodes} NUMA nodes")
    per = cpus // nodes
    cells = tuple(Cell(n, tuple(range(n * per, (n + 1) * per)), memory_mib * 1024 // nodes) for n in range(nodes))
    return HostTopology(cells, source="node-info")


def from_numa_nodes(
    nodes: Sequence[tuple[int, Sequence[int], Sequence[tuple[int, int]]]],
) -> HostTopology:
    """Cells from discovered NUMA nodes: (node, cpus, ((page size KiB, free pages), ...))."""
    cells = tuple(Cell(node, tuple(sorted(cpus)), 0, tuple(pages)) for node, cpus, pages in sorted(nodes))
    return HostTopology(cells, source="discovery")


def format_cpuset(cpus: Sequence[int]) -> str:
    """`[0,1,2,5,7,8]` -> `0-2,5,7-8` (libvirt cpuset syntax)."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def slot_shares(
    slots: Sequence[SlotBundle], topology: HostTopology, *, reserved_per_cell: int = 0
) -> dict[int, tuple[int, ...]]:
    """The host CPUs each approved slot may give its VM (disjoint, deterministic)."""
    shares: dict[int, tuple[int, ...]] = {}
    by_node: dict[int, list[int]] = {}
    for s in slots:
        by_node.setdefault(s.numa_node, []).append(s.slot_index)
    for node, indexes in sorted(by_node.items()):
        cell = topology.cell(node)
        usable = cell.cpus[reserved_per_cell:]
        per = len(usable) // len(indexes)
        if per == 0:
            raise TopologyError(
                f"NUMA node {node} has {len(usable)} usable CPUs for {len(indexes)} slots",
                code=host_codes.TOPOLOGY_TOO_FEW_CPUS,
            )
        for pos, idx in enumerate(sorted(indexes)):
            shares[idx] = usable[pos * per : (pos + 1) * per]
    return shares


def place_vcpus(
    vm: VmSpec,
    approved: Sequence[SlotBundle],
    topology: HostTopology,
    *,
    reserved_per_cell: int = 0,
) -> CpuPlacement:
    """Pin `vm.vcpu_count` vCPUs 1:1 to CPUs local to the NUMA nodes of its slots."""
    slots = list(approved) or list(vm.bundles)
    known = {s.slot_index for s in slots}
    missing = [b.slot_index for b in vm.bundles if b.slot_index not in known]
    if missing:
        raise TopologyError(f"slots {missing} of {vm.allocation_id} are not approved slots of this node")
    if not vm.bundles:
        raise TopologyError(f"{vm.allocation_id} has no slots")
    shares = slot_shares(slots, topology, reserved_per_cell=reserved_per_cell)
    per_node: dict[int, list[int]] = {}
    for b in sorted(vm.bundles, key=lambda b: b.slot_index):
        per_node.setdefault(b.numa_node, []).extend(shares[b.slot_index])
    nodes = sorted(per_node)
    counts = _split(vm.vcpu_count, [sum(1 for b in vm.bundles if b.numa_node == n) for n in nodes])
    pins: list[int] = []
    cells: list[GuestCell] = []
    mem_split = _split(vm.memory_mib, [sum(1 for b in vm.bundles if b.numa_node == n) for n in nodes])
    for node, count, mem in zip(nodes, counts, mem_split, strict=True):
        available = per_node[node]
        if count > len(available):
            raise TopologyError(
                f"{vm.allocation_id} asks {count} vCPUs on NUMA node {node}, but its slots there "
                f"give {len(available)} CPUs ({format_cpuset(available)})",
                code=host_codes.TOPOLOGY_VCPUS_EXCEED_SHARE,
            )
        start = len(pins)
        pins.extend(available[:count])
        cells.append(GuestCell(node, tuple(range(start, start + count)), mem))
    return CpuPlacement(tuple(pins), tuple(nodes), tuple(cells) if len(cells) > 1 else ())


def _split(total: int, weights: Sequence[int]) -> list[int]:
    """Split `total` in proportion to `weights`, remainder to the first parts."""
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    for i in range(total - sum(parts)):
        parts[i % len(parts)] += 1
    return parts
