"""Namespaces, veth pairs and a DHCP client for the host network tests.

Picture of what `Lab` builds (each box a network namespace, all removed after
the test, pass or fail):

    +-------------- host ns "<prefix>h" ---------------+
    |  bridge br-t  10.100.0.1/24   dnsmasq            |
    |    |-- vp-1 (port)    |-- vp-2 (port)            |
    +----|------------------|--------------------------+
         | veth             | veth
    +----|------+     +-----|-----+
    | eth0 MAC1 |     | eth0 MAC2 |    VM namespaces "<prefix>v1", "<prefix>v2"
    +-----------+     +-----------+
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from schemas.hostplans import Network

UDHCPC_SCRIPT = """#!/bin/sh
# udhcpc calls this with the event in $1 and the lease in the environment.
# Record it; configure the address on "bound"/"renew" so the namespace can talk.
echo "$1 ip=$ip mask=$mask router=$router" >> "$LEASE_LOG"
case "$1" in
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    ;;
esac
exit 0
"""


def _need_root_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces")
    for tool in ("ip", "iptables", "dnsmasq", "udhcpc", "busybox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (make apt installs it)")


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def in_ns(ns: str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run argv in namespace `ns`; never raises on exit status (callers assert it)."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


@dataclass
class Lab:
    prefix: str
    tmp: Path
    namespaces: list[str] = field(default_factory=list)

    @property
    def host(self) -> str:
        return f"{self.prefix}h"

    def network(self, bridge: str = "br-t") -> Network:
        return Network(
            subnet="10.100.0.0/24",
            gateway="10.100.0.1",
            dhcp_start="10.100.0.10",
            dhcp_end="10.100.0.200",
            bridge=bridge,
        )

    def namespace(self, suffix: str) -> str:
        name = f"{self.prefix}{suffix}"
        ip("netns", "add", name)
        self.namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def vm(self, index: int, mac: str, bridge: str = "br-t", *, attach: bool = True) -> str:
        """A VM namespace with eth0 (MAC `mac`) wired by veth to port vp-INDEX in the host ns.

        With attach, the port is enslaved to the bridge as a plain (not isolated)
        port, the way libvirt leaves a tap; the driver under test isolates it.
        """
        ns = self.namespace(f"v{index}")
        port = f"vp-{index}"
        with _ipr_in(self.host) as ipr:
            ipr.link("add", ifname=port, kind="veth", peer={"ifname": f"tmp{index}"})
            peer = ipr.link_lookup(ifname=f"tmp{index}")[0]
            ipr.link("set", index=peer, net_ns_fd=f"/run/netns/{ns}")
            idx = ipr.link_lookup(ifname=port)[0]
            if attach:
                br = ipr.link_lookup(ifname=bridge)[0]
                ipr.link("set", index=idx, master=br)
            ipr.link("set", index=idx, state="up")
        ip("-n", ns, "link", "set", f"tmp{index}", "name", "eth0")
        ip("-n", ns, "link", "set", "eth0", "address", mac, "up")
        return ns

    def dhcp(self, ns: str, *, tag: str) -> list[str]:
        """Run udhcpc once in `ns`; return the events its script recorded."""
        script = self.tmp / "udhcpc.sh"
        if not script.exists():
            script.write_text(UDHCPC_SCRIPT)
            script.chmod(0o755)
        log = self.tmp / f"udhcpc-{ns}-{tag}.log"
        env = {"LEASE_LOG": str(log), "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin")}
        subprocess.run(
            # -n: give up without a lease, -q: quit once bound, -f: foreground,
            # -t/-T: 4 discovers 1 s apart, -A 1: no long back-off.
            [
                "ip",
                "netns",
                "exec",
                ns,
                "udhcpc",
                "-i",
                "eth0",
                "-n",
                "-q",
                "-f",
                "-t",
                "4",
                "-T",
                "1",
                "-A",
                "1",
                "-s",
                str(script),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        return log.read_text().splitlines() if log.exists() else []


@contextlib.contextmanager
def _ipr_in(ns: str) -> Iterator[IPRoute]:
    from host_reconciler.drivers import netns

    with netns.iproute(ns) as ipr:
        yield ipr


def _kill_namespace_pids(ns: str) -> None:
    # Only processes inside our own throwaway namespace: ones this test started.
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.fixture
def lab() -> Iterator[Lab]:
    _need_root_tools()
    prefix = f"gpt{os.getpid() % 100000}"
    with tempfile.TemporaryDirectory(prefix="hostnet-") as tmp:
        lab = Lab(prefix=prefix, tmp=Path(tmp))
        try:
            lab.namespace("h")
            yield lab
        finally:
            for ns in reversed(lab.namespaces):
                _kill_namespace_pids(ns)
                subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
