"""The management network of a slice host: one bridge, NAT out, no traffic between VMs.

Seed 002 section 7: every VM's virtio NIC sits on the management bridge
(gateway 10.100.0.1/24 by default), the host masquerades the private subnet
out of its uplink, dnsmasq hands each VM MAC its reserved IP, and east-west
traffic between slices is denied.

`LinuxBridgeNetwork` does that with a Linux bridge driven over netlink
(pyroute2) and iptables argv:

- the bridge carries the gateway address and a fixed MAC derived from its name
  (a Linux bridge otherwise borrows the lowest port MAC, which changes as VMs
  come and go and leaves stale ARP entries in the guests);
- libvirt/qemu create one tap per VM and enslave it; every port of the bridge
  is then marked `isolated` (IFLA_BRPORT_ISOLATED), so the bridge forwards no
  frame from one VM port to another, while each VM still reaches the bridge's
  own address (the gateway, dnsmasq);
- iptables masquerades the subnet to anywhere else, and drops routed traffic
  that enters and leaves by the bridge, so a guest cannot hairpin to its
  neighbour through the host's router either.

Every method is idempotent and says whether it changed anything. The same
Protocol on Open vSwitch is `host_reconciler.drivers.ovs.OvsNetwork`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from host_reconciler import codes as host_codes
from host_reconciler.drivers import addresses, netns
from host_reconciler.drivers.protocols import BridgeState, PortState
from schemas.errors import PermanentError
from schemas.hostplans import Network


class NetworkError(PermanentError):
    code = host_codes.NETWORK_ERROR


def bridge_mac(name: str) -> str:
    """A stable, locally administered unicast MAC for bridge `name`."""
    digest = hashlib.sha256(f"gpuaas-bridge:{name}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def nat_rules(network: Network) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(table, rule spec) pairs for iptables, tagged with a comment naming the bridge.

    Order matters for `-I` (insert at top): the last rule ends up first.
    """
    net = str(addresses.subnet(network))
    br = network.bridge
    tag = ("-m", "comment", "--comment", f"gpuaas:{br}")
    return (
        ("nat", ("POSTROUTING", "-s", net, "!", "-d", net, *tag, "-j", "MASQUERADE")),
        (
            "filter",
            (
                "FORWARD",
                "-o",
                br,
                "!",
                "-i",
                br,
                "-m",
                "conntrack",
                "--ctstate",
                "RELATED,ESTABLISHED",
                *tag,
                "-j",
                "ACCEPT",
            ),
        ),
        ("filter", ("FORWARD", "-i", br, "!", "-o", br, *tag, "-j", "ACCEPT")),
        ("filter", ("FORWARD", "-i", br, "-o", br, *tag, "-j", "DROP")),
    )


def _attr(msg: Any, name: str) -> Any:
    return msg.get_attr(name)


def ensure_gateway(ipr: Any, index: int, network: Network) -> bool:
    """The interface `index` holds the gateway address and is up. True if it changed."""
    net = addresses.subnet(network)
    changed = False
    have = {(_attr(a, "IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=index, family=2)}
    if (network.gateway, net.prefixlen) not in have:
        ipr.addr(
            "add",
            index=index,
            address=network.gateway,
            prefixlen=net.prefixlen,
            broadcast=str(net.broadcast_address),
        )
        changed = True
    if not ipr.get_links(index)[0]["flags"] & 1:  # IFF_UP
        ipr.link("set", index=index, state="up")
        changed = True
    return changed


def l3_state(ipr: Any, index: int) -> tuple[bool, tuple[str, ...]]:
    """(up, sorted IPv4 "addr/prefix" strings) of interface `index`."""
    up = bool(ipr.get_links(index)[0]["flags"] & 1)
    addrs = sorted(f"{_attr(a, 'IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=index, family=2))
    return up, tuple(addrs)


class IptablesNat:
    """The NAT and forwarding rules of one management network (any bridge kind)."""

    def __init__(self, netns_name: str | None = None, *, iptables: str = "iptables") -> None:
        self._netns = netns.checked(netns_name)
        self._iptables = iptables

    def ensure(self, network: Network) -> bool:
        changed = False
        forwarding = netns.run(
            self._netns, ("sysctl", "-n", "net.ipv4.ip_forward"), code=host_codes.NETWORK_SYSCTL_FAILED
        )
        if forwarding.stdout.strip() != "1":
            netns.run(
                self._netns,
                ("sysctl", "-q", "-w", "net.ipv4.ip_forward=1"),
                code=host_codes.NETWORK_SYSCTL_FAILED,
            )
            changed = True
        for table, spec in nat_rules(network):
            if not self._rule_present(table, spec):
                chain, rest = spec[0], spec[1:]
                netns.run(
                    self._netns,
                    (self._iptables, "-w", "-t", table, "-I", chain, "1", *rest),
                    code=host_codes.NETWORK_NAT_FAILED,
                )
                changed = True
        return changed

    def remove(self, network: Network) -> bool:
        changed = False
        for table, spec in nat_rules(network):
            while self._rule_present(table, spec):
                netns.run(
                    self._netns,
                    (self._iptables, "-w", "-t", table, "-D", *spec),
                    code=host_codes.NETWORK_NAT_FAILED,
                )
                changed = True
        return changed

    def present(self, network: Network) -> bool:
        return all(self._rule_present(t, s) for t, s in nat_rules(network))

    def _rule_present(self, table: str, spec: Sequence[str]) -> bool:
        # `iptables -C` exits 1 when the rule is absent; anything else is an error.
        command = (self._iptables, "-w", "-t", table, "-C", *spec)
        proc = netns.run(self._netns, command, code=host_codes.NETWORK_NAT_FAILED, ok=(0, 1))
        return proc.returncode == 0


class LinuxBridgeNetwork:
    """NetworkDriver on a Linux bridge (pyroute2) and iptables, in `netns` or the host."""

    def __init__(self, netns_name: str | None = None, *, iptables: str = "iptables") -> None:
        self._netns = netns.checked(netns_name)
        self._nat = IptablesNat(netns_name, iptables=iptables)

    # -- bridge -----------------------------------------------------------------

    def bridge_exists(self, name: str) -> bool:
        with netns.iproute(self._netns) as ipr:
            return self._bridge_index(ipr, addresses.ifname(name)) is not None

    def ensure_bridge(self, network: Network) -> bool:
        addresses.subnet(network)
        name = network.bridge
        changed = False
        try:
            with netns.iproute(self._netns) as ipr:
                index = self._bridge_index(ipr, name)
                if index is None:
                    ipr.link("add", ifname=name, kind="bridge", address=bridge_mac(name))
                    index = ipr.link_lookup(ifname=name)[0]
                    changed = True
                changed = ensure_gateway(ipr, index, network) or changed
        except NetlinkError as e:
            raise NetworkError(f"cannot set up bridge {name}: {e}", code=host_codes.NETWORK_BRIDGE_FAILED) from e
        return changed

    def remove_bridge(self, network: Network) -> bool:
        name = addresses.ifname(network.bridge)
        with netns.iproute(self._netns) as ipr:
            index = self._bridge_index(ipr, name)
            if index is None:
                return False
            ipr.link("del", index=index)
            return True

    # -- ports ------------------------------------------------------------------

    def attach_port(self, network: Network, port: str) -> bool:
        addresses.ifname(port)
        changed = False
        try:
            with netns.iproute(self._netns) as ipr:
                br = self._require_bridge(ipr, network.bridge)
                found = ipr.link_lookup(ifname=port)
                if not found:
                    raise NetworkError(f"interface {port} does not exist", code=host_codes.NETWORK_PORT_MISSING)
                link = ipr.get_links(found[0])[0]
                if _attr(link, "IFLA_MASTER") != br:
                    ipr.link("set", index=found[0], master=br)
                    changed = True
                if not self._isolated(ipr, found[0]):
                    ipr.brport("set", index=found[0], isolated=1)
                    changed = True
                if not link["flags"] & 1:
                    ipr.link("set", index=found[0], state="up")
                    changed = True
        except NetlinkError as e:
            raise NetworkError(
                f"cannot attach {port} to {network.bridge}: {e}", code=host_codes.NETWORK_PORT_FAILED
            ) from e
        return changed

    def isolate_ports(self, network: Network) -> tuple[str, ...]:
        changed: list[str] = []
        try:
            with netns.iproute(self._netns) as ipr:
                br = self._require_bridge(ipr, network.bridge)
                for index, name in self._ports(ipr, br):
                    if not self._isolated(ipr, index):
                        ipr.brport("set", index=index, isolated=1)
                        changed.append(name)
        except NetlinkError as e:
            raise NetworkError(
                f"cannot isolate ports of {network.bridge}: {e}", code=host_codes.NETWORK_PORT_FAILED
            ) from e
        return tuple(changed)

    # -- NAT --------------------------------------------------------------------

    def ensure_nat(self, network: Network) -> bool:
        return self._nat.ensure(network)

    def remove_nat(self, network: Network) -> bool:
        return self._nat.remove(network)

    def nat_present(self, network: Network) -> bool:
        return self._nat.present(network)

    # -- observe ----------------------------------------------------------------

    def observe(self, network: Network) -> BridgeState:
        name = addresses.ifname(network.bridge)
        with netns.iproute(self._netns) as ipr:
            index = self._bridge_index(ipr, name)
            if index is None:
                return BridgeState(name=name, exists=False, nat=self.nat_present(network))
            up, addrs = l3_state(ipr, index)
            ports = tuple(
                PortState(name=pname, isolated=self._isolated(ipr, pindex)) for pindex, pname in self._ports(ipr, index)
            )
        return BridgeState(
            name=name,
            exists=True,
            up=up,
            addresses=addrs,
            ports=ports,
            nat=self.nat_present(network),
        )

    # -- helpers ----------------------------------------------------------------

    @staticmethod
    def _bridge_index(ipr: Any, name: str) -> int | None:
        found = ipr.link_lookup(ifname=name)
        if not found:
            return None
        link = ipr.get_links(found[0])[0]
        info = _attr(link, "IFLA_LINKINFO")
        kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
        if kind != "bridge":
            raise NetworkError(
                f"{name} exists but is a {kind or 'plain'} interface, not a bridge",
                code=host_codes.NETWORK_NOT_A_BRIDGE,
            )
        return int(found[0])

    def _require_bridge(self, ipr: Any, name: str) -> int:
        index = self._bridge_index(ipr, addresses.ifname(name))
        if index is None:
            raise NetworkError(f"bridge {name} does not exist", code=host_codes.NETWORK_BRIDGE_MISSING)
        return index

    @staticmethod
    def _ports(ipr: Any, bridge_index: int) -> list[tuple[int, str]]:
        return sorted(
            (int(link["index"]), str(_attr(link, "IFLA_IFNAME")))
            for link in ipr.get_links()
            if _attr(link, "IFLA_MASTER") == bridge_index
        )

    @staticmethod
    def _isolated(ipr: Any, index: int) -> bool:
        for msg in ipr.brport("show", index=index):
            info = _attr(msg, "IFLA_PROTINFO")
            if info is not None:
                return bool(info.get_attr("IFLA_BRPORT_ISOLATED"))
        return False
