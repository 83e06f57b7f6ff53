"""The host half of `make demo`: two example nodes converge, drift is injected and reported.

`run_demo(db_url)` expects the central reconciler to have applied
examples/fleet to the database (it applies it itself when the nodes have no
plan yet), then, for h200-use1-s01 (three VMs: 1, 2 and 4 GPUs) and
h200-euw1-s01 (one 8-GPU VM):

1. builds a lab host per node (loop devices named as the slot map names the
   disks, a netns with bridge + dnsmasq, the libvirt test driver, a copy of
   the recorded XE9680L sysfs tree for PCI, NUMA CPUs, hugepages and the
   discovery gate);
2. publishes a raw stand-in image: the example Image digests are placeholders
   and no 20 GB image ships here, so the demo re-stamps the two host plans
   with the stand-in's real digest (generation + 1) and says so;
3. creates each node's database role and runs each host reconciler as it
   (row-level security: a node reads only its own plan);
4. converges both nodes and prints their status;
5. injects drift: a deleted DHCP reservation and a free slot disk mounted on
   the host (s01), a stopped VM and a VF rebound off vfio-pci (euw1-s01);
6. converges in report mode and prints status and `gpuaas drift -o markdown`;
7. runs one self-heal pass on each node and prints what is left (the disk
   and PCI findings stay: self-heal never wipes a disk or rebinds a device).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from gpuaas_tools.lab import host as lab
from host_reconciler import converging, hostdb, reports
from host_reconciler.actions import DriftMode
from host_reconciler.context import Drivers
from host_reconciler.drivers import wiring
from reconciler.store import hostplans as hostplans_store
from reconciler.store import hoststatus
from schemas import driftreports, hostplans
from schemas.errors import PermanentError

DEMO_NODES = {
    # node: (recorded tree to copy, disk serial tag in the tree, tag of this node's disks)
    "h200-use1-s01": ("xe9680l-h200", "S6EXNA0W1", "S6EXNA0W1"),
    "h200-euw1-s01": ("xe9680l-h200", "S6EXNA0W1", "S6EXNA0W3"),
}
# The recorded sysfs trees sit beside the example fleet (examples/sysfs next to
# examples/fleet): found from the fleet path given, not from this file's place.
DEFAULT_FLEET = Path("examples/fleet")


def _heading(out: Callable[[str], None], text: str) -> None:
    out(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def _ensure_plans(db_url: str, fleet: Path, nodes: list[str], out: Callable[[str], None]) -> None:
    from reconciler import sources
    from reconciler.reconcile import reconciling
    from reconciler.store import migrations

    with hostdb.connect(db_url) as conn:
        migrations.migrate(conn)  # idempotent: nothing to do after `gpuaas apply`
        if all(hostdb.read_plan(conn, n) is not None for n in nodes):
            return
        result = reconciling.reconcile(conn, sources.load(fleet).state, source="host-demo")
        counts = reconciling.summary(result)["counts"]
        out(f"applied {fleet}: {counts['placed']} placement(s), {counts['host_plans_written']} host plan(s)")


def _restamp(db_url: str, node: str, image_dir: Path) -> hostplans.HostPlan:
    with hostdb.connect(db_url) as conn:
        plan = hostdb.read_plan(conn, node)
        if plan is None or not plan.vms:
            raise PermanentError(f"no VMs planned on {node}", code="demo.no_plan")
        digests: dict[str, str] = {}

        def stand_in(vm: hostplans.VmSpec) -> hostplans.VmSpec:
            if vm.image is None:
                return vm
            ref = vm.image.source_ref
            if ref not in digests:  # one stand-in per image, shared by every VM that names it
                digests[ref] = lab.publish_image(image_dir, ref)
            return dataclasses.replace(
                vm, image=dataclasses.replace(vm.image, digest_sha256=digests[ref], image_format="raw")
            )

        plan = dataclasses.replace(plan, vms=tuple(stand_in(v) for v in plan.vms))
        (written,) = hostplans_store.store(conn, [plan], revision="host-demo")
        return dataclasses.replace(plan, generation=written.generation)


@dataclass
class _Node:
    host: lab.LabHost
    converger: converging.Converger
    drivers: Drivers
    conn: psycopg.Connection[Any]  # as the node's own role


@dataclass
class _Demo:
    db_url: str
    out: Callable[[str], None]
    sysfs: Path  # the recorded host trees
    nodes: dict[str, _Node] = field(default_factory=dict)

    def central_plan(self, node: str) -> hostplans.HostPlan:
        with hostdb.connect(self.db_url) as conn:
            plan = hostdb.read_plan(conn, node)
        if plan is None:
            raise PermanentError(f"no host plan for {node}", code="demo.no_plan")
        return plan

    def add(self, stack: ExitStack, node: str, root: Path) -> None:
        tree_name, old, new = DEMO_NODES.get(node, ("xe9680l-h200", "S6EXNA0W1", "S6EXNA0W1"))
        tree = lab.retag_tree(self.sysfs / tree_name, root / node / "sysfs", old, new)
        plan = self.central_plan(node)
        host = stack.enter_context(
            lab.lab_host(
                node, root / node, disk_paths=[s.nvme_device for s in plan.slots], os_disk=plan.os_disk, sysfs_tree=tree
            )
        )
        _restamp(self.db_url, node, host.image_dir)
        with hostdb.connect(self.db_url) as conn:
            creds = hostdb.create_node_role(conn, node, f"demo-{node}")
        conn_node = stack.enter_context(hostdb.connect(self.db_url, role=creds.role, password=creds.password))
        s = host.settings()
        drivers = wiring.drivers(s)
        stack.callback(drivers.close)
        self.nodes[node] = _Node(host, converging.Converger(s, drivers), drivers, conn_node)
        self.out(
            f"{node}: {len(plan.slots)} slot disks on loop devices, netns {host.netns}, "
            f"role {creds.role}, sysfs tree {tree}"
        )

    def converge_all(self, title: str, mode: DriftMode = DriftMode.REPORT) -> None:
        _heading(self.out, title)
        for name, n in self.nodes.items():
            plan = hostdb.read_plan(n.conn, name)  # as the node's role: RLS shows its own plan only
            if plan is None:
                raise PermanentError(f"{name} cannot read its plan", code="demo.no_plan")
            result = n.converger.converge(plan, mode=mode)
            hostdb.write_status(n.conn, result.status)
            self.out(f"{name}: ran {len(result.executed)} action(s) in {result.ms:.0f} ms")
            self.out(reports.status_text(result.status.as_dict()))

    def inject(self) -> None:
        _heading(self.out, "inject drift")
        names = list(self.nodes)
        first = self.nodes[names[0]]
        hosts_dir = first.host.settings().dnsmasq_dir / "hosts"
        victim = sorted(p.name for p in hosts_dir.iterdir())[0]
        (hosts_dir / victim).unlink()
        self.out(f"{names[0]}: deleted the DHCP reservation of {victim}")
        p1 = self.central_plan(names[0])
        used = {b.slot_index for v in p1.vms for b in v.bundles}
        free = [s for s in p1.slots if s.slot_index not in used]
        if free:
            point = first.host.mount(free[0].nvme_device)
            self.out(f"{names[0]}: made an ext4 on free slot {free[0].slot_index}'s disk, mounted at {point}")
        if len(names) < 2:
            return
        second = self.nodes[names[1]]
        p2 = self.central_plan(names[1])
        if not p2.vms:
            return
        second.drivers.domains.destroy(p2.vms[0].name)
        self.out(f"{names[1]}: powered off {p2.vms[0].name} behind the reconciler's back")
        vf = p2.vms[0].bundles[-1].fabric_vf_pci_address
        if vf:
            link = Path(second.host.settings_doc["sysfs_root"]) / "bus" / "pci" / "devices" / vf / "driver"
            link.unlink()
            link.symlink_to("../../../bus/pci/drivers/mlx5_core")
            self.out(f"{names[1]}: rebound VF {vf} to mlx5_core in its sysfs tree")

    def report(self, title: str, render: Callable[[list[dict[str, Any]]], str]) -> None:
        _heading(self.out, title)
        with hostdb.connect(self.db_url) as conn:
            self.out(render([n for n in hoststatus.read(conn, None) if n["node"] in self.nodes]).rstrip())


def run_demo(
    db_url: str,
    *,
    fleet: Path | None = None,
    nodes: tuple[str, ...] = tuple(DEMO_NODES),
    workdir: Path | None = None,
    out: Callable[[str], None] = print,
) -> None:
    """Converge two example nodes on lab hosts, inject drift, print status and the drift report."""
    root = workdir or Path(tempfile.mkdtemp(prefix="gpuaas-host-demo-", dir="/tmp"))
    fleet = fleet or DEFAULT_FLEET
    _ensure_plans(db_url, fleet, list(nodes), out)
    demo = _Demo(db_url, out, fleet.resolve().parent / "sysfs")
    try:
        with ExitStack() as stack:
            _heading(out, "lab hosts (libvirt test driver, loop devices, netns + dnsmasq)")
            for node in nodes:
                demo.add(stack, node, root)
            out(
                "the example Image digests are placeholders: each plan was re-stamped with a raw stand-in "
                "image published in the host cache (generation + 1)"
            )
            demo.converge_all("converge (observe, diff, act, report)")
            demo.inject()
            demo.converge_all("converge in report-only mode (the default): nothing is changed")
            demo.report("gpuaas drift -o markdown", driftreports.drift_markdown)
            demo.converge_all("one self-heal pass", DriftMode.SELF_HEAL)
            demo.report("drift left after self-heal (disks and devices need an operator)", driftreports.drift_text)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
