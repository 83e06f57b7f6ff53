"""Pure parts of the network drivers: validation, file formats, rules, drift phrases.

No namespace, no process: tables in, values out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from host_reconciler.drivers import addresses, dnsmasq, network, protocols
from schemas.errors import GpuaasError
from schemas.hostplans import Network, SlotBundle, VmSpec

NET = Network(
    subnet="10.100.0.0/24",
    gateway="10.100.0.1",
    dhcp_start="10.100.0.10",
    dhcp_end="10.100.0.200",
    bridge="br-mgmt",
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("52:54:00:AB:cd:01", "52:54:00:ab:cd:01"),
        (" 52:54:00:00:00:01 ", "52:54:00:00:00:01"),
        ("52-54-00-00-00-01", None),
        ("52:54:00:00:00", None),
        ("01:00:5e:00:00:01", None),  # multicast
        ("52:54:00:00:00:01\nx", None),
        ("52:54:00:00:00:01,10.0.0.1", None),
    ],
)
def test_mac(value: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(addresses.InvalidNetworkValue) as err:
            addresses.mac(value)
        assert err.value.code == "host.net.invalid_mac"
    else:
        assert addresses.mac(value) == expected


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("br0", True),
        ("gpuaas-br.100", True),
        ("a" * 15, True),
        ("a" * 16, False),  # IFNAMSIZ
        ("-br", False),
        ("br 0", False),
        ("br/0", False),
        ("", False),
        ("..", False),
    ],
)
def test_ifname(value: str, ok: bool) -> None:
    if ok:
        assert addresses.ifname(value) == value
    else:
        with pytest.raises(addresses.InvalidNetworkValue):
            addresses.ifname(value)


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("gpuaas-a1", True),
        ("gpuaas-8f3e-0001", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("gpuaas_a1", False),
        ("-gpuaas", False),
        ("gpuaas,x", False),
        ("../etc", False),
    ],
)
def test_hostname(value: str, ok: bool) -> None:
    if ok:
        assert addresses.hostname(value) == value
    else:
        with pytest.raises(addresses.InvalidNetworkValue):
            addresses.hostname(value)


@pytest.mark.parametrize(
    ("value", "code"),
    [
        ("10.100.0.10", None),
        ("10.100.0.254", None),
        ("10.100.0.1", "host.net.ip_is_gateway"),
        ("10.100.0.0", "host.net.ip_outside_subnet"),
        ("10.100.0.255", "host.net.ip_outside_subnet"),
        ("10.100.1.10", "host.net.ip_outside_subnet"),
        ("10.100.0.010", "host.net.invalid_ip"),
        ("fe80::1", "host.net.invalid_ip"),
    ],
)
def test_host_ip(value: str, code: str | None) -> None:
    if code is None:
        assert str(addresses.host_ip(NET, value)) == value
    else:
        with pytest.raises(addresses.InvalidNetworkValue) as err:
            addresses.host_ip(NET, value)
        assert err.value.code == code


@pytest.mark.parametrize(
    "change",
    [
        {"subnet": "10.100.0.1/24"},  # host bits set
        {"subnet": "10.100.0.0/24 -j ACCEPT"},
        {"gateway": "10.100.1.1"},
        {"dhcp_end": "10.100.0.255"},
        {"bridge": "br0;reboot"},
    ],
)
def test_subnet_rejects_inconsistent_networks(change: dict[str, str]) -> None:
    with pytest.raises(addresses.InvalidNetworkValue):
        addresses.subnet(dataclasses.replace(NET, **change))


def _vm(mac: str, ip: str, allocation: str = "a1") -> VmSpec:
    boot = SlotBundle(0, "0000:17:00.0", None, "/dev/disk/by-id/nvme-x", mac, ip, 0)
    other = SlotBundle(1, "0000:18:00.0", None, "/dev/disk/by-id/nvme-y", "52:54:00:00:00:99", "10.100.0.11", 0)
    return VmSpec(allocation, "t", (boot, other), vcpu_count=2, memory_mib=1024)


def test_reservation_for_uses_the_boot_slot_and_canonical_spellings() -> None:
    res = protocols.reservation_for(_vm("52:54:00:AA:BB:01", "10.100.0.10"), NET)
    assert res == protocols.Reservation("gpuaas-a1", "52:54:00:aa:bb:01", "10.100.0.10")
    assert res.line() == "52:54:00:aa:bb:01,10.100.0.10,gpuaas-a1\n"


@pytest.mark.parametrize(
    ("vm", "code"),
    [
        (_vm("52:54:00:aa:bb:01", "10.100.0.1"), "host.net.ip_is_gateway"),
        (_vm("52:54:00:aa:bb:01", "10.100.7.10"), "host.net.ip_outside_subnet"),
        (_vm("zz:54:00:aa:bb:01", "10.100.0.10"), "host.net.invalid_mac"),
        (_vm("52:54:00:aa:bb:01", "10.100.0.10", allocation="A_1"), "host.net.invalid_hostname"),
    ],
)
def test_reservation_for_refuses_bad_values(vm: VmSpec, code: str) -> None:
    with pytest.raises(GpuaasError) as err:
        protocols.reservation_for(vm, NET)
    assert err.value.code == code


def test_reservation_requires_canonical_values() -> None:
    with pytest.raises(addresses.InvalidNetworkValue):
        protocols.Reservation("gpuaas-a1", "52:54:00:AA:BB:01", "10.100.0.10")
    with pytest.raises(addresses.InvalidNetworkValue):
        protocols.Reservation("Gpuaas-a1", "52:54:00:aa:bb:01", "10.100.0.10")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (
            "52:54:00:aa:bb:01,10.100.0.10,gpuaas-a1\n",
            protocols.Reservation("gpuaas-a1", "52:54:00:aa:bb:01", "10.100.0.10"),
        ),
        (
            "# ours\n52:54:00:aa:bb:01,10.100.0.10,gpuaas-a1\n",
            protocols.Reservation("gpuaas-a1", "52:54:00:aa:bb:01", "10.100.0.10"),
        ),
        ("dhcp-host=52:54:00:aa:bb:01,10.100.0.10,gpuaas-a1\n", None),
        ("52:54:00:aa:bb:01,10.100.0.10\n", None),
        ("52:54:00:aa:bb:01,10.100.0.10,a\n52:54:00:aa:bb:02,10.100.0.11,b\n", None),
        ("", None),
    ],
)
def test_parse_reservation(text: str, parsed: protocols.Reservation | None) -> None:
    assert dnsmasq.parse_reservation(text) == parsed


def test_parse_leases_skips_ipv6_and_garbage() -> None:
    text = (
        "1800000600 52:54:00:aa:bb:01 10.100.0.10 gpuaas-a1 01:52:54:00:aa:bb:01\n"
        "0 52:54:00:aa:bb:02 10.100.0.11 * *\n"
        "duid 00:01:00:01:2c:aa:bb:cc\n"
        "1800000600 1234 ::1 host *\n"
        "garbage\n"
    )
    assert dnsmasq.parse_leases(text) == (
        protocols.Lease(1800000600, "52:54:00:aa:bb:01", "10.100.0.10", "gpuaas-a1", "01:52:54:00:aa:bb:01"),
        protocols.Lease(0, "52:54:00:aa:bb:02", "10.100.0.11", None, None),
    )


def test_dnsmasq_argv_is_dhcp_only_on_the_bridge_and_static(tmp_path: Path) -> None:
    server = dnsmasq.DnsmasqServer(tmp_path, no_ping=True)
    argv = server.argv(NET)
    assert argv[0] == "dnsmasq"
    for arg in (
        "--conf-file=/dev/null",
        "--port=0",
        "--bind-interfaces",
        "--interface=br-mgmt",
        "--dhcp-range=10.100.0.0,static,255.255.255.0,12h",
        f"--dhcp-hostsdir={tmp_path / 'hosts'}",
        f"--dhcp-leasefile={tmp_path / 'dnsmasq.leases'}",
        "--no-ping",
    ):
        assert arg in argv
    dynamic = dnsmasq.DnsmasqServer(tmp_path, dynamic=True).argv(NET)
    assert "--dhcp-range=10.100.0.10,10.100.0.200,255.255.255.0,12h" in dynamic
    with pytest.raises(protocols.DhcpError):
        dnsmasq.DnsmasqServer(tmp_path, lease_time="12h,10.0.0.0")


def test_nat_rules_name_the_bridge_and_subnet() -> None:
    rules = network.nat_rules(NET)
    assert rules[0] == (
        "nat",
        (
            "POSTROUTING",
            "-s",
            "10.100.0.0/24",
            "!",
            "-d",
            "10.100.0.0/24",
            "-m",
            "comment",
            "--comment",
            "gpuaas:br-mgmt",
            "-j",
            "MASQUERADE",
        ),
    )
    assert (
        "filter",
        ("FORWARD", "-i", "br-mgmt", "-o", "br-mgmt", "-m", "comment", "--comment", "gpuaas:br-mgmt", "-j", "DROP"),
    ) in rules


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (protocols.BridgeState("br-mgmt", exists=False), ("bridge br-mgmt missing",)),
        (
            protocols.BridgeState("br-mgmt", True, True, ("10.100.0.1/24",), (), nat=True),
            (),
        ),
        (
            protocols.BridgeState(
                "br-mgmt",
                True,
                False,
                ("10.100.0.1/16",),
                (protocols.PortState("vnet0", True), protocols.PortState("vnet1", False)),
                nat=False,
            ),
            (
                "bridge br-mgmt down",
                "bridge br-mgmt lacks gateway 10.100.0.1/24",
                "port vnet1 not isolated",
                "NAT for 10.100.0.0/24 missing",
            ),
        ),
    ],
)
def test_problems(state: protocols.BridgeState, expected: tuple[str, ...]) -> None:
    assert protocols.bridge_problems(NET, state) == expected


def test_bridge_mac_is_stable_local_unicast() -> None:
    mac = network.bridge_mac("br-mgmt")
    assert mac == network.bridge_mac("br-mgmt") != network.bridge_mac("br-other")
    assert addresses.mac(mac) == mac
    assert int(mac[:2], 16) & 0b10  # locally administered
