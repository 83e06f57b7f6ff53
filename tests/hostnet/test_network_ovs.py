"""The OVS driver against a real ovsdb-server + ovs-vswitchd (userspace `netdev` datapath).

Both daemons run inside the lab's host namespace with a private run/db/log
directory, so the machine's own OVS (if any) is never touched; the lab's
teardown ends them with the namespace.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from host_reconciler.drivers import network, ovs, protocols

from .conftest import Lab, in_ns, ip

pytestmark = pytest.mark.root

MAC1 = "52:54:00:00:01:11"
MAC2 = "52:54:00:00:01:12"


@pytest.fixture
def ovsdb(lab: Lab) -> Iterator[str]:
    """Start OVS in the lab host namespace; yield its database address."""
    for tool in ("ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovsdb-tool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (openvswitch-switch)")
    schema = "/usr/share/openvswitch/vswitch.ovsschema"
    run = lab.tmp / "ovs"
    run.mkdir()
    env = {
        **os.environ,
        "OVS_RUNDIR": str(run),
        "OVS_DBDIR": str(run),
        "OVS_LOGDIR": str(run),
        "OVS_SYSCONFDIR": str(run),
    }
    db = f"unix:{run}/db.sock"
    subprocess.run(["ovsdb-tool", "create", str(run / "conf.db"), schema], check=True, env=env)
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            lab.host,
            "ovsdb-server",
            str(run / "conf.db"),
            f"--remote=punix:{run}/db.sock",
            f"--pidfile={run}/ovsdb-server.pid",
            "--detach",
            f"--log-file={run}/ovsdb-server.log",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    subprocess.run(["ovs-vsctl", f"--db={db}", "--no-wait", "init"], check=True, env=env)
    subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            lab.host,
            "ovs-vswitchd",
            db,
            f"--pidfile={run}/ovs-vswitchd.pid",
            "--detach",
            f"--log-file={run}/ovs-vswitchd.log",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    try:
        yield db
    finally:
        for daemon in ("ovs-vswitchd", "ovsdb-server"):
            pid_file = run / f"{daemon}.pid"
            if pid_file.exists():
                subprocess.run(["kill", pid_file.read_text().strip()], check=False)


def _ping(ns: str, target: str) -> bool:
    return in_ns(ns, "busybox", "ping", "-c", "1", "-W", "2", target).returncode == 0


def _vsctl(db: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ovs-vsctl", f"--db={db}", *args], capture_output=True, text=True, check=False)


def test_ovs_bridge_is_netdev_with_the_gateway_and_idempotent(lab: Lab, ovsdb: str) -> None:
    drv = ovs.OvsNetwork(lab.host, db=ovsdb)
    net = lab.network("ovsbr-t")
    assert not drv.bridge_exists("ovsbr-t")
    assert drv.ensure_bridge(net) is True
    assert drv.ensure_bridge(net) is False
    assert _vsctl(ovsdb, "get", "bridge", "ovsbr-t", "datapath_type").stdout.strip() == "netdev"
    assert _vsctl(ovsdb, "get", "interface", "ovsbr-t", "ofport").stdout.strip() == "65534"
    state = drv.observe(net)
    assert state.exists and state.up and state.addresses == ("10.100.0.1/24",)
    assert protocols.bridge_problems(net, state) == ("NAT for 10.100.0.0/24 missing",)
    assert drv.ensure_nat(net) is True
    assert protocols.bridge_problems(net, drv.observe(net)) == ()
    assert drv.remove_bridge(net) is True
    assert drv.remove_bridge(net) is False


def test_ovs_protected_ports_reach_the_gateway_but_not_each_other(lab: Lab, ovsdb: str) -> None:
    drv = ovs.OvsNetwork(lab.host, db=ovsdb)
    net = lab.network("ovsbr-t")
    drv.ensure_bridge(net)
    vm1 = lab.vm(1, MAC1, attach=False)
    vm2 = lab.vm(2, MAC2, attach=False)
    # As libvirt's <virtualport type='openvswitch'/> leaves them: plain ports.
    for port in ("vp-1", "vp-2"):
        assert _vsctl(ovsdb, "add-port", "ovsbr-t", port).returncode == 0
    ip("-n", vm1, "addr", "add", "10.100.0.11/24", "dev", "eth0")
    ip("-n", vm2, "addr", "add", "10.100.0.12/24", "dev", "eth0")
    assert {p.name: p.isolated for p in drv.observe(net).ports} == {"vp-1": False, "vp-2": False}
    assert _ping(vm1, "10.100.0.12")  # control: NORMAL switching between plain ports

    assert drv.isolate_ports(net) == ("vp-1", "vp-2")
    assert drv.isolate_ports(net) == ()
    for ns in (vm1, vm2):
        ip("-n", ns, "neigh", "flush", "all")
    assert _ping(vm1, "10.100.0.1")
    assert _ping(vm2, "10.100.0.1")
    assert not _ping(vm1, "10.100.0.12")
    assert not _ping(vm2, "10.100.0.11")


def test_ovs_attach_port_checks_ofport_because_vsctl_exits_zero(lab: Lab, ovsdb: str) -> None:
    drv = ovs.OvsNetwork(lab.host, db=ovsdb, timeout_s=5)
    net = lab.network("ovsbr-t")
    drv.ensure_bridge(net)
    lab.vm(1, MAC1, attach=False)
    assert drv.attach_port(net, "vp-1") is True
    assert drv.attach_port(net, "vp-1") is False
    assert drv.observe(net).ports == (protocols.PortState("vp-1", isolated=True),)

    # The database accepts a port for a device that does not exist (exit 0)...
    assert _vsctl(ovsdb, "add-port", "ovsbr-t", "ghost0").returncode == 0
    assert _vsctl(ovsdb, "del-port", "ovsbr-t", "ghost0").returncode == 0
    # ...so the driver reads the ofport back, fails, and removes the port again.
    with pytest.raises(network.NetworkError) as err:
        drv.attach_port(net, "ghost0")
    assert err.value.code == "host.network.ovs_interface_failed"
    assert "ghost0" in err.value.message
    assert [p.name for p in drv.observe(net).ports] == ["vp-1"]
