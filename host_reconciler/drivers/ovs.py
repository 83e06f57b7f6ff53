"""The management network on Open vSwitch, behind the same NetworkDriver Protocol.

Seed 002 runs the management plane on an OVS bridge (`ovsbr0`); where the host
has no OVS kernel datapath the bridge uses the userspace one
(`datapath_type=netdev`). The rest of the model is the Linux bridge's:

- the bridge's internal interface carries the gateway address (pyroute2);
- every VM port is `protected=true`: OVS's NORMAL action forwards nothing from
  one protected port to another, while each still reaches the bridge's own
  (unprotected) internal port, i.e. the gateway and dnsmasq. This is OVS's
  counterpart of a Linux bridge port's `isolated` flag;
- NAT and the no-hairpin FORWARD rule are the same iptables rules.

`ovs-vsctl` may exit 0 although the switch could not create an interface (the
database transaction succeeded, ovs-vswitchd failed), so every add is checked
by reading back the interface's `ofport` (-1 or empty means failure, with the
reason in its `error` column).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from host_reconciler import codes as host_codes
from host_reconciler.drivers import addresses, netns
from host_reconciler.drivers.network import (
    IptablesNat,
    NetworkError,
    bridge_mac,
    ensure_gateway,
    l3_state,
)
from host_reconciler.drivers.protocols import BridgeState, PortState
from schemas.hostplans import Network

_DB = re.compile(r"^(unix:/[A-Za-z0-9_./-]+|tcp:[0-9.]+:[0-9]+)$")
_LOCAL_OFPORT = 65534  # OpenFlow's LOCAL: the bridge's internal interface
_COMMAND_OPTIONS = frozenset({"--", "--may-exist", "--if-exists"})  # what _run's callers may pass


class OvsNetwork:
    """NetworkDriver on an OVS bridge via ovs-vsctl argv, in `netns` or the host."""

    def __init__(
        self,
        netns_name: str | None = None,
        *,
        db: str | None = None,
        datapath_type: str = "netdev",
        vsctl: str = "ovs-vsctl",
        iptables: str = "iptables",
        timeout_s: int = 10,
    ) -> None:
        if db is not None and not _DB.match(db):
            raise NetworkError(f"not an OVSDB address: {db!r}", code=host_codes.NETWORK_OVS_DB)
        if datapath_type not in ("netdev", "system"):
            raise NetworkError(f"unknown datapath type {datapath_type!r}", code=host_codes.NETWORK_OVS_DATAPATH)
        self._netns = netns.checked(netns_name)
        self._db = db
        self._datapath = datapath_type
        self._vsctl = vsctl
        self._timeout = timeout_s
        self._nat = IptablesNat(netns_name, iptables=iptables)

    # -- bridge -----------------------------------------------------------------

    def bridge_exists(self, name: str) -> bool:
        # `ovs-vsctl br-exists` exits 2 for "no such bridge".
        return self._run("br-exists", addresses.ifname(name), ok=(0, 2)).returncode == 0

    def ensure_bridge(self, network: Network) -> bool:
        addresses.subnet(network)
        br = network.bridge
        changed = False
        if not self.bridge_exists(br):
            self._run(
                "--may-exist",
                "add-br",
                br,
                "--",
                "set",
                "bridge",
                br,
                f"datapath_type={self._datapath}",
                f'other-config:hwaddr="{bridge_mac(br)}"',
            )
            changed = True
        elif self._get("bridge", br, "datapath_type") != self._datapath:
            self._run("set", "bridge", br, f"datapath_type={self._datapath}")
            changed = True
        self._check_ofport(br, expect=_LOCAL_OFPORT)
        try:
            with netns.iproute(self._netns) as ipr:
                index = self._wait_link(ipr, br)
                changed = ensure_gateway(ipr, index, network) or changed
        except NetlinkError as e:
            raise NetworkError(f"cannot address OVS bridge {br}: {e}", code=host_codes.NETWORK_BRIDGE_FAILED) from e
        return changed

    def remove_bridge(self, network: Network) -> bool:
        br = addresses.ifname(network.bridge)
        if not self.bridge_exists(br):
            return False
        self._run("--if-exists", "del-br", br)
        return True

    # -- ports ------------------------------------------------------------------

    def attach_port(self, network: Network, port: str) -> bool:
        addresses.ifname(port)
        br = self._require_bridge(network)
        changed = False
        # `port-to-br` exits 1 when the port is on no bridge.
        owner = self._run("port-to-br", port, ok=(0, 1)).stdout.strip()
        if owner and owner != br:
            raise NetworkError(f"{port} is a port of {owner}, not {br}", code=host_codes.NETWORK_PORT_ELSEWHERE)
        if not owner:
            self._run("--may-exist", "add-port", br, port, "--", "set", "port", port, "protected=true")
            changed = True
        elif self._get("port", port, "protected") != "true":
            self._run("set", "port", port, "protected=true")
            changed = True
        try:
            self._check_ofport(port)
        except NetworkError:
            if changed:  # leave no half-made port behind in the database
                self._run("--if-exists", "del-port", br, port)
            raise
        with netns.iproute(self._netns) as ipr:
            index = ipr.link_lookup(ifname=port)[0]
            if not ipr.get_links(index)[0]["flags"] & 1:
                ipr.link("set", index=index, state="up")
                changed = True
        return changed

    def isolate_ports(self, network: Network) -> tuple[str, ...]:
        br = self._require_bridge(network)
        changed: list[str] = []
        for port in self._ports(br):
            if self._get("port", port, "protected") != "true":
                self._run("set", "port", port, "protected=true")
                changed.append(port)
        return tuple(changed)

    # -- NAT --------------------------------------------------------------------

    def ensure_nat(self, network: Network) -> bool:
        return self._nat.ensure(network)

    def remove_nat(self, network: Network) -> bool:
        return self._nat.remove(network)

    # -- observe ----------------------------------------------------------------

    def observe(self, network: Network) -> BridgeState:
        br = addresses.ifname(network.bridge)
        nat = self._nat.present(network)
        if not self.bridge_exists(br):
            return BridgeState(name=br, exists=False, nat=nat)
        up = False
        addrs: tuple[str, ...] = ()
        with netns.iproute(self._netns) as ipr:
            found = ipr.link_lookup(ifname=br)
            if found:
                up, addrs = l3_state(ipr, int(found[0]))
        ports = tuple(PortState(p, self._get("port", p, "protected") == "true") for p in self._ports(br))
        return BridgeState(name=br, exists=True, up=up, addresses=addrs, ports=ports, nat=nat)

    # -- helpers ----------------------------------------------------------------

    def _run(self, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        """ovs-vsctl with our global options, "--", then `args` (commands and their options).

        After "--" ovs-vsctl still reads command options (`--may-exist`) and "--"
        as a command separator, so every argument that starts with '-' must be
        one of the literals we use: a bridge or port name never can.
        """
        for arg in args:
            if arg.startswith("-") and arg not in _COMMAND_OPTIONS:
                raise NetworkError(f"refusing {arg!r} as an ovs-vsctl argument", code=host_codes.TOOL_ARGV)
        try:
            return netns.run(
                self._netns,
                [
                    self._vsctl,
                    f"--timeout={self._timeout}",
                    *([] if self._db is None else [f"--db={self._db}"]),
                    "--",
                    *args,
                ],
                code=host_codes.NETWORK_OVS_FAILED,
                ok=ok,
            )
        except netns.CommandError as e:
            raise NetworkError(e.message, code=host_codes.NETWORK_OVS_FAILED) from e

    def _get(self, table: str, record: str, column: str) -> str:
        """One column as ovs-vsctl prints it: `[]` when empty, strings JSON-quoted."""
        value: str = self._run("--if-exists", "get", table, record, column).stdout.strip()
        if value.startswith('"'):
            unquoted: str = json.loads(value)
            return unquoted
        return value

    def _ports(self, br: str) -> list[str]:
        return sorted(p for p in self._run("list-ports", br).stdout.split() if p)

    def _require_bridge(self, network: Network) -> str:
        br = addresses.ifname(network.bridge)
        if not self.bridge_exists(br):
            raise NetworkError(f"OVS bridge {br} does not exist", code=host_codes.NETWORK_BRIDGE_MISSING)
        return br

    def _check_ofport(self, iface: str, expect: int | None = None) -> None:
        """Fail unless ovs-vswitchd really created `iface` (ofport assigned, no error)."""
        deadline = time.monotonic() + self._timeout
        while True:
            raw = self._get("interface", iface, "ofport")
            ofport = int(raw) if raw.lstrip("-").isdigit() else None
            if ofport is not None and ofport > 0 and (expect is None or ofport == expect):
                return
            if ofport == -1 or time.monotonic() > deadline:
                error = self._get("interface", iface, "error")
                reason = error if error not in ("", "[]") else "no ofport assigned"
                raise NetworkError(
                    f"OVS could not create interface {iface}: {reason}", code=host_codes.NETWORK_OVS_INTERFACE_FAILED
                )
            time.sleep(0.1)

    def _wait_link(self, ipr: Any, name: str) -> int:
        deadline = time.monotonic() + self._timeout
        while True:
            found = ipr.link_lookup(ifname=name)
            if found:
                return int(found[0])
            if time.monotonic() > deadline:
                raise NetworkError(
                    f"OVS bridge {name} has no internal interface", code=host_codes.NETWORK_OVS_INTERFACE_FAILED
                )
            time.sleep(0.1)
