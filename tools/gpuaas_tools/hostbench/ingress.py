"""`gpuaas bench ingress`: public SSH endpoints on a namespace lab (root; ip, iptables).

    outside ns 203.0.113.2 ──veth── 203.0.113.1 host ns ── bridge ── VM ns 10.100.0.10 (TCP :22 banner)

ingress_phase_ms      the `ingress` phase of one VM (its DNAT + forward rules, read back and added):
                      median of --runs
ready_to_ssh_ms       from the moment the phase returns (readiness passes only after it) to the
                      outside's first banner read through the public port: median of --runs
rules_per_node_<n>    iptables rules in our chains with --allocations VMs on one node (SSH only)
                      plus the two hooks (PREROUTING, FORWARD)
install_<n>_ms        installing every endpoint of those VMs from nothing
pass_<n>_ms           the ingress share of one host pass with them in place: observe (iptables -S
                      of both chains, hooks checked) + the pure diff and drift; median of --runs
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

from schemas import hostplans as hp

PUBLIC = "203.0.113.1"
NET = hp.Network("10.100.0.0/24", "10.100.0.1", "10.100.0.10", "10.100.0.250", "gpuaasbr0")
LISTENER = (
    "import socket\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', 22)); s.listen(64); print('up', flush=True)\n"
    "while True:\n"
    "    c,_=s.accept(); c.sendall(b'SSH-2.0-bench\\r\\n'); c.close()\n"
)


def register(sub: Any) -> None:
    p = sub.add_parser("ingress", help="public SSH endpoints: phase time, ready-to-SSH, 64 VMs a node (needs root)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--allocations", type=int, default=64)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def _lab() -> Iterator[tuple[str, str, str]]:
    from host_reconciler.drivers import netns, network

    tag = uuid.uuid4().hex[:6]
    host, outside, vm = f"gbi{tag}h", f"gbi{tag}o", f"gbi{tag}v"
    made: list[str] = []
    server: subprocess.Popen[str] | None = None
    try:
        for ns in (host, outside, vm):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        nd = network.LinuxBridgeNetwork(host)
        nd.ensure_bridge(NET)
        nd.ensure_nat(NET)
        with netns.iproute(host) as ipr:
            for name, peer, target in (("up0", "tmpo", outside), ("vp0", "tmpv", vm)):
                ipr.link("add", ifname=name, kind="veth", peer={"ifname": peer})
                ipr.link("set", index=ipr.link_lookup(ifname=peer)[0], net_ns_fd=f"/run/netns/{target}")
            ipr.link("set", index=ipr.link_lookup(ifname="vp0")[0], master=ipr.link_lookup(ifname=NET.bridge)[0])
        _ip("-n", host, "addr", "add", f"{PUBLIC}/24", "dev", "up0")
        for dev in ("up0", "vp0"):
            _ip("-n", host, "link", "set", dev, "up")
        for ns, peer, addr in ((outside, "tmpo", "203.0.113.2/24"), (vm, "tmpv", "10.100.0.10/24")):
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", addr, "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", vm, "route", "add", "default", "via", NET.gateway)
        server = subprocess.Popen(
            ["ip", "netns", "exec", vm, sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True
        )
        if server.stdout is None or server.stdout.readline().strip() != "up":
            raise RuntimeError("the VM's listener did not start")
        yield host, outside, vm
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        for ns in reversed(made):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def _answers(outside: str, port: int, deadline_s: float = 10.0) -> float:
    """Seconds until a banner is read from PUBLIC:port inside `outside` (retrying until the deadline)."""
    from host_reconciler.drivers import netns

    t0 = time.monotonic()
    while True:
        with netns.entered(outside):
            s = socket.socket()
        try:
            s.settimeout(1.0)
            s.connect((PUBLIC, port))
            if s.recv(64).startswith(b"SSH-"):
                return time.monotonic() - t0
        except OSError:
            if time.monotonic() - t0 > deadline_s:
                raise
        finally:
            s.close()


def _vm(i: int) -> hp.VmSpec:
    b = hp.SlotBundle(
        i,
        f"0000:{i % 256:02x}:00.0",
        None,
        f"/dev/disk/by-id/nvme-B{i}",
        f"52:54:00:bb:{i // 256 % 256:02x}:{i % 256:02x}",
        f"10.100.0.{10 + i % 240}",
        0,
    )
    return hp.VmSpec(f"bench-{i:04d}", "bench", (b,), 4, 4096)


def run(args: argparse.Namespace) -> int:
    from host_reconciler import diff, ingresses
    from host_reconciler.actions import Step
    from host_reconciler.drivers import ingress
    from host_reconciler.observations import HostObservation, PhaseRecord, Progress

    if os.geteuid() != 0:
        print("bench ingress needs root (network namespaces, iptables)", file=sys.stderr)
        return 2
    out: dict[str, Any] = {}
    with _lab() as (host, outside, _vm_ns):
        drv = ingress.IptablesIngress(host)
        phase, ready = [], []
        for r in range(args.runs):
            rule = hp.IngressRule(f"bench-r{r}", PUBLIC, 20000 + r, "10.100.0.10", 22)
            t0 = time.monotonic()
            drv.add(NET.bridge, rule)
            phase.append((time.monotonic() - t0) * 1000)
            ready.append(_answers(outside, rule.public_port) * 1000)
            drv.delete(rule)
        out["ingress_phase_ms"] = round(statistics.median(phase), 2)
        out["ready_to_ssh_ms"] = round(statistics.median(ready), 3)
        n = args.allocations
        vms = tuple(_vm(i) for i in range(n))
        rules = tuple(
            hp.IngressRule(v.allocation_id, PUBLIC, 30000 + i, v.bundles[0].private_ip, 22) for i, v in enumerate(vms)
        )
        plan = hp.HostPlan("bench", 1, NET, "/dev/disk/by-id/os", vms=vms, ingress=rules)
        t0 = time.monotonic()
        for rule in rules:
            drv.add(NET.bridge, rule)
        out[f"install_{n}_ms"] = round((time.monotonic() - t0) * 1000, 1)
        done = MappingProxyType({str(Step.READINESS): PhaseRecord(1.0, "t")})
        progress = {v.allocation_id: Progress(v.allocation_id, "x", done) for v in vms}
        passes = []
        for _ in range(args.runs):
            t0 = time.monotonic()
            observed = HostObservation(ingress=drv.observe(), progress=progress)
            found = list(ingresses.drift(plan, observed, vms))
            steps = [a for a in diff.diff(plan, observed) if a.step in (Step.INGRESS, Step.REMOVE_STRAY_INGRESS)]
            passes.append((time.monotonic() - t0) * 1000)
            if found or steps:
                raise RuntimeError(f"{n} endpoints in place, yet drift {found[:2]} / steps {steps[:2]}")
        seen = drv.observe()
        out[f"rules_per_node_{n}"] = len(seen.dnat) + len(seen.forward) + 2
        out[f"pass_{n}_ms"] = round(statistics.median(passes), 2)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:24s} {v}")
    return 0
