"""The Linux bridge driver against real namespaces: bridge, NAT rules, port isolation."""

from __future__ import annotations

import dataclasses

import pytest

from host_reconciler.drivers import network, protocols
from schemas.errors import GpuaasError

from .conftest import Lab, in_ns, ip

pytestmark = pytest.mark.root

MAC1 = "52:54:00:00:00:11"
MAC2 = "52:54:00:00:00:12"


def _ping(ns: str, target: str) -> bool:
    return in_ns(ns, "busybox", "ping", "-c", "1", "-W", "1", target).returncode == 0


def test_ensure_bridge_creates_once_and_observes(lab: Lab) -> None:
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()

    assert not drv.bridge_exists(net.bridge)
    assert protocols.bridge_problems(net, drv.observe(net)) == ("bridge br-t missing",)

    assert drv.ensure_bridge(net) is True
    assert drv.ensure_bridge(net) is False  # idempotent
    assert drv.bridge_exists(net.bridge)

    state = drv.observe(net)
    assert state.exists and state.up
    assert state.addresses == ("10.100.0.1/24",)
    assert state.ports == ()
    assert protocols.bridge_problems(net, state) == ("NAT for 10.100.0.0/24 missing",)
    link = ip("-n", lab.host, "-br", "link", "show", "br-t").stdout
    assert network.bridge_mac("br-t") in link


def test_ensure_bridge_repairs_a_downed_bridge_and_lost_address(lab: Lab) -> None:
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()
    drv.ensure_bridge(net)
    ip("-n", lab.host, "addr", "flush", "dev", "br-t")
    ip("-n", lab.host, "link", "set", "br-t", "down")
    assert set(protocols.bridge_problems(net, drv.observe(net))) >= {
        "bridge br-t down",
        "bridge br-t lacks gateway 10.100.0.1/24",
    }
    assert drv.ensure_bridge(net) is True
    state = drv.observe(net)
    assert state.up and state.addresses == ("10.100.0.1/24",)


def test_a_non_bridge_interface_of_that_name_is_refused(lab: Lab) -> None:
    ip("-n", lab.host, "link", "add", "br-t", "type", "veth", "peer", "name", "br-t-peer")
    drv = network.LinuxBridgeNetwork(lab.host)
    with pytest.raises(network.NetworkError) as err:
        drv.ensure_bridge(lab.network())
    assert err.value.code == "host.network.not_a_bridge"


def test_invalid_names_never_reach_netlink_or_iptables(lab: Lab) -> None:
    drv = network.LinuxBridgeNetwork(lab.host)
    bad = dataclasses.replace(lab.network(), bridge="br0; rm -rf /")
    with pytest.raises(GpuaasError) as err:
        drv.ensure_bridge(bad)
    assert err.value.code == "host.net.invalid_ifname"
    with pytest.raises(GpuaasError) as err:
        drv.ensure_nat(bad)
    assert err.value.code == "host.net.invalid_ifname"
    with pytest.raises(GpuaasError) as err:
        drv.ensure_nat(dataclasses.replace(lab.network(), subnet="10.100.0.0/24 -j ACCEPT"))
    assert err.value.code == "host.net.invalid_subnet"


def test_ensure_nat_adds_masquerade_and_forward_rules_once(lab: Lab) -> None:
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()
    drv.ensure_bridge(net)

    assert drv.ensure_nat(net) is True
    assert drv.ensure_nat(net) is False
    assert in_ns(lab.host, "sysctl", "-n", "net.ipv4.ip_forward").stdout.strip() == "1"
    nat = in_ns(lab.host, "iptables", "-t", "nat", "-S", "POSTROUTING").stdout
    assert nat.count("-j MASQUERADE") == 1
    assert "-s 10.100.0.0/24 ! -d 10.100.0.0/24" in nat
    fwd = in_ns(lab.host, "iptables", "-S", "FORWARD").stdout
    assert "-i br-t -o br-t" in fwd and "-j DROP" in fwd
    assert protocols.bridge_problems(net, drv.observe(net)) == ()

    assert drv.remove_nat(net) is True
    assert drv.remove_nat(net) is False
    assert "gpuaas:br-t" not in in_ns(lab.host, "iptables-save").stdout


def test_ports_isolated_vms_reach_the_gateway_but_not_each_other(lab: Lab) -> None:
    """East-west denied: two VM ports on one bridge, each reaches 10.100.0.1, not its peer."""
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()
    drv.ensure_bridge(net)
    vm1 = lab.vm(1, MAC1)
    vm2 = lab.vm(2, MAC2)
    ip("-n", vm1, "addr", "add", "10.100.0.11/24", "dev", "eth0")
    ip("-n", vm2, "addr", "add", "10.100.0.12/24", "dev", "eth0")

    # Control: as libvirt leaves them (plain ports), the VMs do see each other,
    # so the failures below are the isolation's doing, not a broken setup.
    state = drv.observe(net)
    assert {p.name: p.isolated for p in state.ports} == {"vp-1": False, "vp-2": False}
    assert {"port vp-1 not isolated", "port vp-2 not isolated"} <= set(protocols.bridge_problems(net, state))
    assert _ping(vm1, "10.100.0.12")

    # Port isolation alone (no iptables rule yet) stops the bridge forwarding
    # between the two VM ports; the bridge's own address stays reachable.
    assert drv.isolate_ports(net) == ("vp-1", "vp-2")
    assert drv.isolate_ports(net) == ()
    assert all(p.isolated for p in drv.observe(net).ports)
    for ns in (vm1, vm2):
        ip("-n", ns, "neigh", "flush", "all")
    assert _ping(vm1, "10.100.0.1")
    assert _ping(vm2, "10.100.0.1")
    assert not _ping(vm1, "10.100.0.12")
    assert not _ping(vm2, "10.100.0.11")


def test_guests_cannot_hairpin_to_each_other_through_the_gateway(lab: Lab) -> None:
    """Isolated at L2, a guest could still route to its neighbour via the host; NAT's
    FORWARD rule drops traffic that enters and leaves by the bridge."""
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()
    drv.ensure_bridge(net)
    drv.ensure_nat(net)
    vm1 = lab.vm(1, MAC1)
    vm2 = lab.vm(2, MAC2)
    drv.isolate_ports(net)
    for ns, mine, peer in (
        (vm1, "10.100.0.11", "10.100.0.12"),
        (vm2, "10.100.0.12", "10.100.0.11"),
    ):
        in_ns(ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.accept_redirects=0")
        ip("-n", ns, "addr", "add", f"{mine}/24", "dev", "eth0")
        ip("-n", ns, "route", "add", f"{peer}/32", "via", "10.100.0.1")
    assert protocols.bridge_problems(net, drv.observe(net)) == ()
    assert _ping(vm1, "10.100.0.1")
    assert not _ping(vm1, "10.100.0.12")

    # Control: without the DROP rule the hairpin works, so the rule is what stops it.
    drop = ("-i", "br-t", "-o", "br-t", "-m", "comment", "--comment", "gpuaas:br-t", "-j", "DROP")
    assert in_ns(lab.host, "iptables", "-D", "FORWARD", *drop).returncode == 0
    assert _ping(vm1, "10.100.0.12")
    assert "NAT for 10.100.0.0/24 missing" in protocols.bridge_problems(net, drv.observe(net))
    assert drv.ensure_nat(net) is True
    assert not _ping(vm1, "10.100.0.12")


def test_attach_port_enslaves_isolates_and_raises_it(lab: Lab) -> None:
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()
    drv.ensure_bridge(net)
    vm1 = lab.vm(1, MAC1, attach=False)
    ip("-n", lab.host, "link", "set", "vp-1", "down")

    assert drv.attach_port(net, "vp-1") is True
    assert drv.attach_port(net, "vp-1") is False
    assert drv.observe(net).ports == (protocols.PortState("vp-1", isolated=True),)
    ip("-n", vm1, "addr", "add", "10.100.0.11/24", "dev", "eth0")
    assert _ping(vm1, "10.100.0.1")

    with pytest.raises(network.NetworkError) as err:
        drv.attach_port(net, "vp-9")
    assert err.value.code == "host.network.port_missing"


def test_remove_bridge(lab: Lab) -> None:
    drv = network.LinuxBridgeNetwork(lab.host)
    net = lab.network()
    drv.ensure_bridge(net)
    assert drv.remove_bridge(net) is True
    assert drv.remove_bridge(net) is False
    assert not drv.bridge_exists("br-t")
