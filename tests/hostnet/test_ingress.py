"""Public SSH endpoints through real iptables DNAT, between real namespaces.

    outside ns  203.0.113.2/24 ──veth── 203.0.113.1/24  host ns  (the node's public address)
                                                          bridge br-t 10.100.0.1/24, NAT + east-west DROP
                                                            |-- vp-1 ── VM1 ns 10.100.0.10  (TCP :22 "SSH" banner)
                                                            |-- vp-2 ── VM2 ns 10.100.0.11  (a neighbour)

The "outside" reaches VM1 only through 203.0.113.1:20000; VM2 cannot hairpin
through the same endpoint; the ruleset is read back with `iptables -S`; drift
is made by deleting and adding rules by hand, and healed by the steps.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from host_reconciler import diff, ingresses, ingressing
from host_reconciler.actions import Action, DriftCode, Flow, Step
from host_reconciler.drivers import ingress, netns, network
from host_reconciler.observations import HostObservation
from schemas.hostplans import HostPlan, IngressRule, SlotBundle, VmSpec

from .conftest import Lab, in_ns, ip

pytestmark = pytest.mark.root

PUBLIC = "203.0.113.1"
RULE = IngressRule("alloc-a", PUBLIC, 20000, "10.100.0.10", 22)
BANNER = b"SSH-2.0-lab\r\n"
LISTENER = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 22)); s.listen(8); print('up', flush=True)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(b'SSH-2.0-lab\\r\\n'); c.close()\n"
)


def _vm(alloc: str, slot: int, ip_: str) -> VmSpec:
    bundle = SlotBundle(
        slot, f"0000:1b:00.{slot}", None, f"/dev/disk/by-id/nvme-x{slot}", f"52:54:00:00:00:1{slot}", ip_, 0
    )
    return VmSpec(alloc, "t", (bundle,), 4, 4096)


@pytest.fixture
def wired(lab: Lab) -> Iterator[dict[str, Any]]:
    net = lab.network()
    nd = network.LinuxBridgeNetwork(lab.host)
    nd.ensure_bridge(net)
    nd.ensure_nat(net)
    outside = lab.namespace("o")
    with netns.iproute(lab.host) as ipr:
        ipr.link("add", ifname="up0", kind="veth", peer={"ifname": "tmpo"})
        peer = ipr.link_lookup(ifname="tmpo")[0]
        ipr.link("set", index=peer, net_ns_fd=f"/run/netns/{outside}")
    ip("-n", lab.host, "addr", "add", f"{PUBLIC}/24", "dev", "up0")
    ip("-n", lab.host, "link", "set", "up0", "up")
    ip("-n", outside, "link", "set", "tmpo", "name", "eth0")
    ip("-n", outside, "addr", "add", "203.0.113.2/24", "dev", "eth0")
    ip("-n", outside, "link", "set", "eth0", "up")
    vms = {}
    for i, addr in ((1, "10.100.0.10"), (2, "10.100.0.11")):
        ns = lab.vm(i, f"52:54:00:00:00:1{i}")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        ip("-n", ns, "route", "add", "default", "via", "10.100.0.1")
        vms[i] = ns
    server = subprocess.Popen(
        ["ip", "netns", "exec", vms[1], sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        plan = HostPlan(
            node="n",
            generation=1,
            network=net,
            os_disk="/dev/disk/by-id/os",
            vms=(_vm("alloc-a", 0, "10.100.0.10"),),
            ingress=(RULE,),
        )
        yield {
            "outside": outside,
            "vm1": vms[1],
            "vm2": vms[2],
            "plan": plan,
            "driver": ingress.IptablesIngress(lab.host),
        }
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def _banner(ns: str, host: str = PUBLIC, port: int = 20000, timeout: float = 2.0) -> bytes | None:
    """Connect from inside `ns` (the socket stays in the namespace it was made in)."""
    with netns.entered(ns):
        s = socket.socket()
    try:
        s.settimeout(timeout)
        s.connect((host, port))
        return s.recv(64)
    except OSError:
        return None
    finally:
        s.close()


def _ctx(plan: HostPlan, driver: ingress.IptablesIngress) -> Any:
    # The ingress steps read only the plan and the ingress driver of their context.
    return SimpleNamespace(plan=plan, drivers=SimpleNamespace(ingress=driver))


def _drift(plan: HostPlan, driver: ingress.IptablesIngress) -> list[str]:
    observed = HostObservation(ingress=driver.observe())
    return sorted(str(d.code) for d in ingresses.drift(plan, observed, plan.vms))


def test_the_outside_reaches_the_vm_only_through_its_endpoint(lab: Lab, wired: dict[str, Any]) -> None:
    drv, plan = wired["driver"], wired["plan"]
    assert _banner(wired["outside"]) is None  # nothing is DNAT'd yet
    assert drv.observe().complete == frozenset()

    assert drv.add(plan.network.bridge, RULE) is True
    assert drv.add(plan.network.bridge, RULE) is False  # idempotent
    assert _banner(wired["outside"]) == BANNER
    assert _banner(wired["outside"], port=20001, timeout=0.5) is None  # only the planned port

    nat = in_ns(lab.host, "iptables", "-t", "nat", "-S").stdout
    assert "-A PREROUTING -j GPUAAS-INGRESS" in nat
    assert (
        "-A GPUAAS-INGRESS -d 203.0.113.1/32 -p tcp -m tcp --dport 20000 -m comment --comment "
        '"gpuaas-ingress:alloc-a" -j DNAT --to-destination 10.100.0.10:22'
    ) in nat
    filt = in_ns(lab.host, "iptables", "-t", "filter", "-S").stdout
    assert "-A FORWARD -j GPUAAS-INGRESS-FWD" in filt
    assert "--ctstate DNAT --ctorigdst 203.0.113.1 --ctorigdstport 20000" in filt
    assert drv.observe().complete == frozenset({RULE})
    assert Step.INGRESS not in [a.step for a in diff.diff(plan, HostObservation(ingress=drv.observe()))]


def _accepted(lab: Lab) -> int:
    """Packets our forward rule let through (iptables' own counter)."""
    out = in_ns(lab.host, "iptables", "-w", "-t", "filter", "-L", "GPUAAS-INGRESS-FWD", "-n", "-v", "-x").stdout
    rows = [line.split() for line in out.splitlines()[2:] if line.strip()]
    return sum(int(r[0]) for r in rows)


def test_east_west_isolation_holds_through_the_public_endpoint(lab: Lab, wired: dict[str, Any]) -> None:
    wired["driver"].add(wired["plan"].network.bridge, RULE)
    assert _accepted(lab) == 0
    assert _banner(wired["vm2"], timeout=1.0) is None  # a neighbour cannot hairpin into VM1...
    assert _accepted(lab) == 0  # ...because our rule never accepts what enters from the bridge
    assert _banner(wired["outside"]) == BANNER
    assert _accepted(lab) > 0  # while the outside's connection went through it


def test_drift_by_hand_is_reported_and_healed(lab: Lab, wired: dict[str, Any]) -> None:
    drv, plan = wired["driver"], wired["plan"]
    ctx = _ctx(plan, drv)
    ingressing.install(ctx, Action(Flow.PROVISION, Step.INGRESS, "alloc-a"), plan.vms[0])
    assert _drift(plan, drv) == []

    # missing: the DNAT deleted by hand
    spec = ingress.dnat_spec(RULE)
    assert in_ns(lab.host, "iptables", "-t", "nat", "-D", "GPUAAS-INGRESS", *spec).returncode == 0
    assert _drift(plan, drv) == [str(DriftCode.INGRESS_MISSING)]
    assert _banner(wired["outside"], timeout=0.5) is None
    # extra: a tagged rule for an allocation no plan names; foreign: an untagged rule in our chain
    stray = IngressRule("alloc-gone", PUBLIC, 20005, "10.100.0.11", 22)
    drv.add(plan.network.bridge, stray)
    assert (
        in_ns(
            lab.host,
            "iptables",
            "-t",
            "nat",
            "-A",
            "GPUAAS-INGRESS",
            "-p",
            "tcp",
            "--dport",
            "20009",
            "-j",
            "DNAT",
            "--to-destination",
            "10.100.0.11:22",
        ).returncode
        == 0
    )
    assert _drift(plan, drv) == sorted(
        map(str, (DriftCode.INGRESS_EXTRA, DriftCode.INGRESS_FOREIGN, DriftCode.INGRESS_MISSING))
    )
    heals = [a.step for a in diff.diff(plan, _observed_active(plan, drv), mode=_self_heal())]
    assert Step.REMOVE_STRAY_INGRESS in heals and Step.INGRESS in heals
    assert heals.index(Step.REMOVE_STRAY_INGRESS) < heals.index(Step.INGRESS)

    ingressing.remove_strays(ctx, Action(Flow.HEAL, Step.REMOVE_STRAY_INGRESS, ""), None)
    ingressing.install(ctx, Action(Flow.HEAL, Step.INGRESS, "alloc-a"), plan.vms[0])
    assert _drift(plan, drv) == []
    assert _banner(wired["outside"]) == BANNER
    nat = in_ns(lab.host, "iptables", "-t", "nat", "-S", "GPUAAS-INGRESS").stdout
    assert "20009" not in nat and "alloc-gone" not in nat


def test_release_removes_every_rule_of_the_allocation(lab: Lab, wired: dict[str, Any]) -> None:
    drv, plan = wired["driver"], wired["plan"]
    drv.add(plan.network.bridge, RULE)
    released = HostPlan(node="n", generation=2, network=plan.network, os_disk=plan.os_disk, releases=plan.vms)
    steps = [a.step for a in diff.diff(released, HostObservation(ingress=drv.observe()))]
    assert Step.REMOVE_INGRESS in steps
    assert steps.index(Step.REMOVE_INGRESS) < steps.index(Step.WIPE)
    ingressing.remove(_ctx(released, drv), Action(Flow.RELEASE, Step.REMOVE_INGRESS, "alloc-a"), plan.vms[0])
    assert drv.observe().written == frozenset()
    assert _banner(wired["outside"], timeout=0.5) is None
    assert Step.REMOVE_INGRESS not in [a.step for a in diff.diff(released, HostObservation(ingress=drv.observe()))]


def _self_heal() -> Any:
    from host_reconciler.actions import DriftMode

    return DriftMode.SELF_HEAL


def _observed_active(plan: HostPlan, drv: ingress.IptablesIngress) -> HostObservation:
    """The ingress as seen, beside a VM that passed readiness (only then is divergence drift)."""
    from types import MappingProxyType

    from host_reconciler.observations import PhaseRecord, Progress

    vm = plan.vms[0]
    progress = Progress(vm.allocation_id, "x", MappingProxyType({str(Step.READINESS): PhaseRecord(1.0, "t")}))
    return HostObservation(ingress=drv.observe(), progress={vm.allocation_id: progress})
