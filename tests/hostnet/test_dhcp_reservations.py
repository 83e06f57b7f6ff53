"""A real dnsmasq on the bridge in one namespace, a real udhcpc in another.

Proves the reservation path end to end: the MAC gets exactly its reserved IP;
a changed reservation hands out the new IP (and stops serving an old MAC) and
a deleted one hands out nothing, each after the driver's SIGHUP; a MAC with no
reservation gets nothing at all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from host_reconciler.drivers import dnsmasq, network, protocols
from schemas.hostplans import SlotBundle, VmSpec

from .conftest import Lab

pytestmark = pytest.mark.root

MAC1 = "52:54:00:aa:00:01"
MAC2 = "52:54:00:aa:00:02"


@pytest.fixture
def dhcp(lab: Lab) -> Iterator[dnsmasq.DnsmasqDhcp]:
    net = lab.network()
    network.LinuxBridgeNetwork(lab.host).ensure_bridge(net)
    server = dnsmasq.DnsmasqServer(lab.tmp / "dnsmasq", netns_name=lab.host, no_ping=True, lease_time="2m", user="root")
    driver = dnsmasq.DnsmasqDhcp(server)
    try:
        yield driver
    finally:
        server.stop()


def _bound(events: list[str]) -> str | None:
    for line in events:
        if line.startswith("bound "):
            return line.split()[1].removeprefix("ip=")
    return None


def _vm(allocation: str, mac: str, ip: str) -> VmSpec:
    bundle = SlotBundle(
        slot_index=0,
        gpu_pci_address="0000:17:00.0",
        fabric_vf_pci_address=None,
        nvme_device="/dev/disk/by-id/nvme-test",
        mac_address=mac,
        private_ip=ip,
        numa_node=0,
    )
    return VmSpec(allocation_id=allocation, tenant="t", bundles=(bundle,), vcpu_count=1, memory_mib=256)


def test_reserved_mac_gets_its_ip_then_change_and_delete_take_effect(lab: Lab, dhcp: dnsmasq.DnsmasqDhcp) -> None:
    net = lab.network()
    assert dhcp.ensure_running(lab.network()) is True
    assert dhcp.ensure_running(lab.network()) is False  # found by its pid file
    vm = lab.vm(1, MAC1)

    res = protocols.reservation_for(_vm("a1", MAC1.upper(), "10.100.0.10"), net)
    assert res == protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.10")
    assert dhcp.ensure_reservation(res) is True
    assert dhcp.ensure_reservation(res) is False
    assert (dhcp.server.hosts_dir / "gpuaas-a1").read_text() == f"{MAC1},10.100.0.10,gpuaas-a1\n"
    assert _bound(lab.dhcp(vm, tag="first")) == "10.100.0.10"
    assert [(lease.mac, lease.ip) for lease in dhcp.leases()] == [(MAC1, "10.100.0.10")]

    # Change of IP: dnsmasq 2.90 picks a changed file up by inotify alone...
    moved = protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.20")
    assert dhcp.ensure_reservation(moved) is True
    assert dhcp.reservations() == (moved,)
    assert dhcp.leases() == ()  # the void MAC1/.10 lease was released
    assert _bound(lab.dhcp(vm, tag="changed")) == "10.100.0.20"

    # ...but it only ever adds records: the old MAC's record survives a change
    # of MAC, or a delete, until SIGHUP. These two steps fail without it.
    vm2 = lab.vm(2, MAC2)
    renic = protocols.Reservation("gpuaas-a1", MAC2, "10.100.0.20")
    assert dhcp.ensure_reservation(renic) is True
    assert _bound(lab.dhcp(vm, tag="old-mac")) is None
    assert _bound(lab.dhcp(vm2, tag="new-mac")) == "10.100.0.20"

    assert [(lease.mac, lease.ip) for lease in dhcp.leases()] == [(MAC2, "10.100.0.20")]
    assert dhcp.remove_reservation("gpuaas-a1") is True
    assert dhcp.remove_reservation("gpuaas-a1") is False
    assert dhcp.reservations() == ()
    assert dhcp.leases() == ()  # no lease left to fake the next readiness check
    assert _bound(lab.dhcp(vm2, tag="deleted")) is None


def test_unreserved_mac_gets_no_address(lab: Lab, dhcp: dnsmasq.DnsmasqDhcp) -> None:
    dhcp.ensure_running(lab.network())
    dhcp.ensure_reservation(protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.10"))
    stranger = lab.vm(2, MAC2)
    assert _bound(lab.dhcp(stranger, tag="stranger")) is None
    assert "no address available" in dhcp.server.log_file.read_text()


def test_prune_removes_reservations_of_released_vms(lab: Lab, dhcp: dnsmasq.DnsmasqDhcp) -> None:
    dhcp.ensure_running(lab.network())
    vm1, vm2 = lab.vm(1, MAC1), lab.vm(2, MAC2)
    dhcp.ensure_reservation(protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.10"))
    dhcp.ensure_reservation(protocols.Reservation("gpuaas-a2", MAC2, "10.100.0.11"))
    # A leftover temp file of an interrupted write is not a reservation.
    (dhcp.server.hosts_dir / ".gpuaas-a3.tmp").write_text("junk")

    assert dhcp.prune_reservations(keep={"gpuaas-a1"}) == ("gpuaas-a2",)
    assert dhcp.prune_reservations(keep={"gpuaas-a1"}) == ()
    assert [r.name for r in dhcp.reservations()] == ["gpuaas-a1"]
    assert _bound(lab.dhcp(vm1, tag="kept")) == "10.100.0.10"
    assert _bound(lab.dhcp(vm2, tag="pruned")) is None


def test_server_stops_and_restarts_keeping_reservations(lab: Lab, dhcp: dnsmasq.DnsmasqDhcp) -> None:
    dhcp.ensure_running(lab.network())
    pid = dhcp.server.pid()
    assert pid is not None
    dhcp.ensure_reservation(protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.10"))
    assert dhcp.server.stop() is True
    assert dhcp.server.stop() is False
    assert dhcp.server.reload() is False  # nothing to signal; start reads the dir
    assert dhcp.ensure_running(lab.network()) is True
    assert dhcp.server.pid() not in (None, pid)
    vm = lab.vm(1, MAC1)
    assert _bound(lab.dhcp(vm, tag="restarted")) == "10.100.0.10"


def test_start_failure_is_a_project_error(lab: Lab) -> None:
    # No bridge in the namespace: dnsmasq cannot bind and its exit status says so.
    server = dnsmasq.DnsmasqServer(lab.tmp / "d2", netns_name=lab.host, user="root")
    with pytest.raises(protocols.DhcpError) as err:
        server.start(lab.network())
    assert err.value.code == "host.dhcp.start_failed"
    assert not server.running()
