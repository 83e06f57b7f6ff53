"""Validation of the network identifiers that reach files and commands.

A MAC, an IP, an interface name or a host name from a host plan ends up in a
dnsmasq hosts file, an iptables argv or a netlink request. Each is checked
here first and returned in one canonical spelling, so a malformed value is a
`host.net.invalid_*` error and never a corrupt reservation or an odd argument.
"""

from __future__ import annotations

import ipaddress
import re

from desired.patterns import MAC_RE
from host_reconciler import codes as host_codes
from schemas.errors import PermanentError
from schemas.hostplans import Network

_MAC = re.compile(MAC_RE)
# Linux IFNAMSIZ is 16 with the NUL; keep to characters every tool accepts.
_IFNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
# One DNS label (RFC 1123): what dnsmasq accepts as a dhcp-host name.
_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class InvalidNetworkValue(PermanentError):
    code = host_codes.NET_INVALID_VALUE


def mac(value: str) -> str:
    """A unicast MAC in lower case with colons, or InvalidNetworkValue."""
    v = value.strip().lower()
    if not _MAC.match(v):
        raise InvalidNetworkValue(f"not a MAC address: {value!r}", code=host_codes.NET_INVALID_MAC)
    if int(v[:2], 16) & 1:
        raise InvalidNetworkValue(f"multicast MAC cannot be a VM address: {value!r}", code=host_codes.NET_INVALID_MAC)
    return v


def ipv4(value: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value.strip())
    except ValueError as e:
        raise InvalidNetworkValue(f"not an IPv4 address: {value!r}", code=host_codes.NET_INVALID_IP) from e


def ifname(value: str) -> str:
    if not _IFNAME.match(value) or value in {".", ".."}:
        raise InvalidNetworkValue(f"not a usable interface name: {value!r}", code=host_codes.NET_INVALID_IFNAME)
    return value


def hostname(value: str) -> str:
    v = value.lower()
    if not _HOSTNAME.match(v):
        raise InvalidNetworkValue(
            f"not a DNS label usable as a DHCP host name: {value!r}",
            code=host_codes.NET_INVALID_HOSTNAME,
        )
    return v


def subnet(network: Network) -> ipaddress.IPv4Network:
    """The network's subnet, checked to contain its gateway and DHCP range."""
    try:
        net = ipaddress.IPv4Network(network.subnet, strict=True)
    except ValueError as e:
        raise InvalidNetworkValue(f"not an IPv4 subnet: {network.subnet!r}", code=host_codes.NET_INVALID_SUBNET) from e
    for label, value in (
        ("gateway", network.gateway),
        ("dhcp_start", network.dhcp_start),
        ("dhcp_end", network.dhcp_end),
    ):
        addr = ipv4(value)
        if addr not in net or addr in (net.network_address, net.broadcast_address):
            raise InvalidNetworkValue(
                f"{label} {value} is not a host address of {net}", code=host_codes.NET_INVALID_SUBNET
            )
    ifname(network.bridge)
    return net


def host_ip(network: Network, value: str) -> ipaddress.IPv4Address:
    """An address a VM may hold on this network: inside it, not the gateway, not its ends."""
    net = subnet(network)
    addr = ipv4(value)
    if addr not in net or addr in (net.network_address, net.broadcast_address):
        raise InvalidNetworkValue(f"{value} is not a host address of {net}", code=host_codes.NET_IP_OUTSIDE_SUBNET)
    if addr == ipv4(network.gateway):
        raise InvalidNetworkValue(f"{value} is the gateway of {net}", code=host_codes.NET_IP_IS_GATEWAY)
    return addr
