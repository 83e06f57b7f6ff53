"""Domain XML from slot bundles, checked by libvirt itself (test driver), and CPU pinning.

host (test:///node.xml): NUMA 0 = CPUs 0-7, NUMA 1 = CPUs 8-15
slots 0,1 on NUMA 0 (4 CPUs each), slots 2,3 on NUMA 1 (4 CPUs each)
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from host_reconciler import domains, pinning
from host_reconciler.drivers import libvirt_driver
from schemas import hostplans as hp
from schemas.errors import GpuaasError, PermanentError
from tests.host.conftest import NETWORK, SLOTS, node_xml


def bundle(slot: int) -> hp.SlotBundle:
    _s, gpu, vf, numa = SLOTS[slot]
    return hp.SlotBundle(
        slot, gpu, vf, f"/dev/disk/by-id/nvme-S{slot}", f"52:54:00:aa:00:{slot:02x}", f"10.100.0.{10 + slot}", numa
    )


APPROVED = tuple(bundle(i) for i in range(4))


def vm(slots: tuple[int, ...], vcpus: int, memory_mib: int = 2048, hugepages: bool = False) -> hp.VmSpec:
    return hp.VmSpec(
        "alloc-x",
        "acme",
        tuple(bundle(s) for s in slots),
        vcpu_count=vcpus,
        memory_mib=memory_mib,
        hugepages=hugepages,
        hugepage_size="1G" if hugepages else None,
    )


def test_topology_from_capabilities_of_the_default_test_host() -> None:
    conn = libvirt.open("test:///default")
    try:
        topo = pinning.from_capabilities(conn.getCapabilities())
    finally:
        conn.close()
    assert [(c.id, c.cpus) for c in topo.cells] == [(0, tuple(range(8))), (1, tuple(range(8, 16)))]
    assert topo.cells[0].page_count(1048576) == 0


def test_topology_from_a_node_file(tmp_path: Path) -> None:
    domains_ = libvirt_driver.LibvirtDomains(node_xml(tmp_path / "node.xml"))
    try:
        topo = domains_.topology()
    finally:
        domains_.close()
    assert topo.source == "node-info"
    assert [(c.id, c.cpus) for c in topo.cells] == [(0, tuple(range(8))), (1, tuple(range(8, 16)))]


@pytest.mark.parametrize(
    ("slots", "vcpus", "pins", "cells"),
    [
        ((0,), 4, (0, 1, 2, 3), 0),
        ((1,), 2, (4, 5), 0),  # slot 1's share of NUMA 0, never slot 0's
        ((2,), 3, (8, 9, 10), 0),
        ((0, 1), 8, tuple(range(8)), 0),
        ((1, 2), 6, (4, 5, 6, 8, 9, 10), 2),  # spans both nodes: one guest cell each
    ],
)
def test_vcpus_are_pinned_to_numa_local_cpus_derived_from_topology(
    slots: tuple[int, ...], vcpus: int, pins: tuple[int, ...], cells: int
) -> None:
    topo = pinning.HostTopology((pinning.Cell(0, tuple(range(8))), pinning.Cell(1, tuple(range(8, 16)))))
    placed = pinning.place_vcpus(vm(slots, vcpus), APPROVED, topo)
    assert placed.pins == pins
    assert len(placed.guest_cells) == cells


def test_more_vcpus_than_the_slots_share_is_refused() -> None:
    topo = pinning.HostTopology((pinning.Cell(0, tuple(range(8))), pinning.Cell(1, tuple(range(8, 16)))))
    with pytest.raises(PermanentError) as e:
        pinning.place_vcpus(vm((0,), 24), APPROVED, topo)
    assert e.value.code == "host.topology.vcpus_exceed_share"


def test_reserved_host_cpus_are_never_pinned() -> None:
    topo = pinning.HostTopology((pinning.Cell(0, tuple(range(10))), pinning.Cell(1, tuple(range(10, 20)))))
    placed = pinning.place_vcpus(vm((0,), 4), APPROVED, topo, reserved_per_cell=2)
    assert placed.pins == (2, 3, 4, 5)


def defined_xml(tmp_path: Path, spec: hp.VmSpec, **opts: object) -> ET.Element:
    driver = libvirt_driver.LibvirtDomains(node_xml(tmp_path / "node.xml"))
    try:
        placement = pinning.place_vcpus(spec, APPROVED, driver.topology())
        options = domains.DomainOptions(domain_type="test", **opts)  # type: ignore[arg-type]
        xml = domains.build(
            spec,
            network=NETWORK,
            placement=placement,
            options=options,
            digest=domains.spec_digest(spec, NETWORK, options),
        )
        driver.define(xml)  # libvirt parses and validates it
        observed = driver.domains()[spec.name]
        assert observed.facts.spec_digest == domains.spec_digest(spec, NETWORK, options)
        conn = driver._c()
        return ET.fromstring(conn.lookupByName(spec.name).XMLDesc(0))  # noqa: S314 -- libvirt's own output
    finally:
        driver.close()


def test_domain_xml_is_accepted_by_libvirt_and_has_every_required_part(tmp_path: Path) -> None:
    spec = vm((1, 2), 6, memory_mib=4096, hugepages=True)
    root = defined_xml(tmp_path, spec, seed_iso="/var/lib/gpuaas/host/seeds/gpuaas-alloc-x/seed.iso")
    assert root.findtext("name") == "gpuaas-alloc-x" and root.findtext("uuid") == hp.vm_uuid("alloc-x")
    assert root.find("./os").get("firmware") == "efi"
    assert root.find("./os/firmware/feature[@name='secure-boot']").get("enabled") == "no"
    assert root.find("./cpu").get("mode") == "host-passthrough"
    pins = {p.get("vcpu"): p.get("cpuset") for p in root.findall("./cputune/vcpupin")}
    assert pins == {"0": "4", "1": "5", "2": "6", "3": "8", "4": "9", "5": "10"}
    assert root.find("./numatune/memory").get("nodeset") == "0-1"
    assert len(root.findall("./cpu/numa/cell")) == 2
    assert root.find("./memoryBacking/hugepages/page").get("size") == "1048576"
    hostdevs = sorted(
        "{:04x}:{:02x}:{:02x}.{:x}".format(*(int(a.get(k), 16) for k in ("domain", "bus", "slot", "function")))
        for a in root.findall("./devices/hostdev/source/address")
    )
    assert hostdevs == sorted([SLOTS[1][1], SLOTS[1][2], SLOTS[2][1], SLOTS[2][2]])
    assert all(h.get("managed") == "no" for h in root.findall("./devices/hostdev"))
    disks = root.findall("./devices/disk[@type='block']")
    assert [d.find("source").get("dev") for d in disks] == ["/dev/disk/by-id/nvme-S1", "/dev/disk/by-id/nvme-S2"]
    assert all(d.find("driver").get("type") == "raw" for d in disks)
    assert root.find("./devices/disk[@device='cdrom']/source").get("file").endswith("seed.iso")
    nics = root.findall("./devices/interface")
    assert len(nics) == 1 and nics[0].find("mac").get("address") == "52:54:00:aa:00:01"
    assert nics[0].find("source").get("bridge") == NETWORK.bridge
    assert root.find("./devices/serial") is not None and root.find("./devices/console") is not None
    assert root.find("./devices/graphics") is None and root.find("./devices/tpm") is None


def test_hugepages_must_fill_whole_pages(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as e:
        defined_xml(tmp_path, vm((0,), 2, memory_mib=1536, hugepages=True))
    assert e.value.code == "host.domain.hugepages"


def test_libvirt_errors_become_project_errors(tmp_path: Path) -> None:
    driver = libvirt_driver.LibvirtDomains(node_xml(tmp_path / "node.xml"))
    try:
        with pytest.raises(GpuaasError) as e:
            driver.define("<domain type='test'><name>gpuaas-bad</name></domain>")
        assert not isinstance(e.value, libvirt.libvirtError)
        driver.undefine("gpuaas-none")  # a missing domain is already undefined
        driver.destroy("gpuaas-none")
        assert driver.state("gpuaas-none") is None
    finally:
        driver.close()


def test_lifecycle_define_start_shutdown_undefine(tmp_path: Path) -> None:
    spec = vm((0,), 2)
    driver = libvirt_driver.LibvirtDomains(node_xml(tmp_path / "node.xml"))
    try:
        placement = pinning.place_vcpus(spec, APPROVED, driver.topology())
        options = domains.DomainOptions(domain_type="test")
        driver.define(domains.build(spec, network=NETWORK, placement=placement, options=options, digest="d"))
        driver.start(spec.name)
        driver.start(spec.name)  # idempotent
        assert driver.domains()[spec.name].running
        driver.shutdown(spec.name)
        driver.undefine(spec.name)
        driver.undefine(spec.name)
        assert spec.name not in driver.domains()
    finally:
        driver.close()
