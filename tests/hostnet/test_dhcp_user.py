"""dnsmasq as it runs on a host: dropped to `nobody`, its hosts dir under a 0700 state dir (issue 15).

No `user="root"` here: dnsmasq started as root drops to its unprivileged
user before it reads the reservation files, and reads them again at every
SIGHUP. The driver must make them reachable, or choose the user explicitly.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from host_reconciler.drivers import dnsmasq, network, protocols

from .conftest import Lab
from .test_dhcp_reservations import MAC1, _bound

pytestmark = pytest.mark.root


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError("no Uid line")


def _serve_one(lab: Lab, server: dnsmasq.DnsmasqServer) -> str | None:
    network.LinuxBridgeNetwork(lab.host).ensure_bridge(lab.network())
    dhcp = dnsmasq.DnsmasqDhcp(server)
    try:
        dhcp.ensure_running(lab.network())
        dhcp.ensure_reservation(protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.10"))
        return _bound(lab.dhcp(lab.vm(1, MAC1), tag="nobody"))
    finally:
        server.stop()


def test_reservations_are_served_by_dnsmasq_as_nobody_under_a_private_state_dir(lab: Lab) -> None:
    lab.tmp.chmod(0o755)  # a root like /var/lib; the host's own state dir below it is private
    state = lab.tmp / "state"
    state.mkdir(mode=0o700)
    (state / "journal").mkdir(mode=0o700)
    server = dnsmasq.DnsmasqServer(state / "dnsmasq", netns_name=lab.host, no_ping=True)
    network.LinuxBridgeNetwork(lab.host).ensure_bridge(lab.network())
    dhcp = dnsmasq.DnsmasqDhcp(server)
    try:
        assert dhcp.ensure_running(lab.network()) is True
        pid = server.pid()
        assert pid is not None and _uid_of(pid) == 65534 and server.runs_as == "nobody"
        dhcp.ensure_reservation(protocols.Reservation("gpuaas-a1", MAC1, "10.100.0.10"))
        assert _bound(lab.dhcp(lab.vm(1, MAC1), tag="nobody")) == "10.100.0.10"
    finally:
        server.stop()
    log = server.log_file.read_text()
    assert "bad dynamic directory" not in log and "Permission denied" not in log
    # only the search bit was added to the state dir: nothing in it can be listed, its other dirs stay private
    assert stat.S_IMODE(state.stat().st_mode) == 0o701
    assert stat.S_IMODE((state / "journal").stat().st_mode) == 0o700


def test_a_directory_above_that_bars_the_user_makes_the_driver_choose_the_user(lab: Lab) -> None:
    barred = lab.tmp / "someone-elses"
    barred.mkdir(mode=0o700)
    os.chown(barred, 12345, 12345)  # not ours to open up
    state = barred / "state"
    state.mkdir(mode=0o700)
    server = dnsmasq.DnsmasqServer(state / "dnsmasq", netns_name=lab.host, no_ping=True)
    assert _serve_one(lab, server) == "10.100.0.10"
    assert server.runs_as == "root"  # the hosts dir's owner, named explicitly
    assert "--user=root" in server.argv(lab.network())
    assert "bad dynamic directory" not in server.log_file.read_text()
    assert stat.S_IMODE(barred.stat().st_mode) == 0o700  # left as it was
