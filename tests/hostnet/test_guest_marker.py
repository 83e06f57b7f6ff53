"""Seed 002's guest marker: the guest announces /var/lib/gpuaas/slice-ready, the gate waits for it.

    guest (here: busybox sh + wget, or urllib)          host agent
    seed: announcer script, URL file, body file   ──POST name+token──▶  Announcements on the
    marker appears -> announcer posts, every minute                     bridge address (127.0.0.1 here)
                                                                        LeaseReadiness stage 3

The listener is real (127.0.0.1, an ephemeral port); the gate's waits run on
a fake clock. The announcer script the seed installs runs for real under
busybox sh, with its paths moved into a temporary directory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_reconciler import cloudinit
from host_reconciler.drivers import guestmarker, protocols, readiness
from schemas import hostplans as hp

from .test_readiness import MAC, NOW, FakeClock, _accept, _lease

NAME = "gpuaas-alloc-1"
SECRET = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def heard() -> Iterator[guestmarker.Announcements]:
    a = guestmarker.Announcements(SECRET, port=0)
    try:
        yield a
    finally:
        a.close()


def post(url: str, body: bytes, path: str = guestmarker.PATH) -> int:
    req = urllib.request.Request(url.replace(guestmarker.PATH, path), data=body, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310 -- http://127.0.0.1 only
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_only_the_vms_own_token_marks_it_ready(heard: guestmarker.Announcements) -> None:
    announce = heard.announce_for(NAME, "127.0.0.1")
    assert announce.url == f"http://127.0.0.1:{heard.port}{guestmarker.PATH}" and heard.port != 0
    other = guestmarker.Announcements(b"another host's secret, 32 bytes", port=0)
    assert other.token(NAME) != heard.token(NAME)  # per-host secret
    assert heard.token("gpuaas-alloc-2") != heard.token(NAME)  # per VM

    assert post(announce.url, f"name={NAME}&token={heard.token('gpuaas-alloc-2')}".encode()) == 403
    assert post(announce.url, f"name={NAME}&token={'0' * 32}".encode()) == 403
    assert post(announce.url, b"name=NOT A NAME&token=00") == 400
    assert post(announce.url, b"\xff\xfe") == 400
    assert post(announce.url, b"x" * 2000) == 400
    assert post(announce.url, announce.body.encode(), path="/elsewhere") == 404
    assert heard.heard(NAME) is None

    assert post(announce.url, announce.body.encode() + b"\n") == 204
    h = heard.heard(NAME)
    assert h is not None and h.ip == "127.0.0.1"
    heard.forget(NAME)
    assert heard.heard(NAME) is None


def test_the_secret_is_made_once_and_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "guest-marker.key"
    first = guestmarker.load_secret(path)
    assert len(first) == 32 and path.stat().st_mode & 0o777 == 0o600
    assert guestmarker.load_secret(path) == first  # a restarted agent checks the tokens it seeded
    lazy = guestmarker.Announcements(path)
    assert lazy.token(NAME) == guestmarker.Announcements(first).token(NAME)


def test_a_taken_port_is_a_coded_error(heard: guestmarker.Announcements) -> None:
    heard.listen("127.0.0.1")
    clash = guestmarker.Announcements(SECRET, port=heard.port)
    with pytest.raises(guestmarker.ListenError) as err:
        clash.listen("127.0.0.1")
    assert err.value.code == "host.readiness.marker_listen"


def _gate(leases: Path, clock: FakeClock, heard: guestmarker.Announcements) -> readiness.LeaseReadiness:
    return readiness.LeaseReadiness(
        leases, clock=clock, wall_clock=lambda: NOW, sleep=clock.sleep, connect=_accept, poll_s=1.0, announcements=heard
    )


def test_the_gate_waits_for_the_marker_after_the_port(tmp_path: Path, heard: guestmarker.Announcements) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "127.0.0.1", expires=0)
    clock = FakeClock()
    gate = _gate(leases, clock, heard)
    announce = gate.announce_for(NAME, "127.0.0.1")
    assert announce is not None

    def guest_announces_at_107(t: float) -> None:
        if t == 107:
            assert post(announce.url, announce.body.encode()) == 204

    clock.on_sleep = guest_announces_at_107
    result = gate.wait_ready(MAC, "127.0.0.1", 22, 60, name=NAME, gateway="127.0.0.1")
    assert (result.lease_s, result.ready_s) == (0.0, 7.0)  # lease and port at once, the marker after 7 s


def test_no_marker_is_a_marker_timeout_that_reschedules(tmp_path: Path, heard: guestmarker.Announcements) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "10.100.0.10", expires=0)
    gate = _gate(leases, FakeClock(), heard)
    announce = gate.announce_for(NAME, "127.0.0.1")
    assert announce is not None
    assert post(announce.url, announce.body.encode()) == 204  # from 127.0.0.1, not the VM's reserved IP
    with pytest.raises(readiness.ReadinessTimeout) as err:
        gate.wait_ready(MAC, "10.100.0.10", 22, 5, name=NAME, gateway="127.0.0.1")
    assert (err.value.code, err.value.stage) == ("host.readiness.marker_timeout", "marker")
    assert "an announcement came from 127.0.0.1" in err.value.message
    # a new seed forgets what an earlier VM of that name said
    gate.announce_for(NAME, "127.0.0.1")
    assert heard.heard(NAME) is None


def test_without_announcements_the_gate_asks_the_seed_for_nothing(tmp_path: Path) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "10.100.0.10", expires=0)
    gate = readiness.LeaseReadiness(leases, wall_clock=lambda: NOW, connect=_accept)
    assert gate.announce_for(NAME, "10.100.0.1") is None
    assert gate.wait_ready(MAC, "10.100.0.10", 22, 5, name=NAME, gateway="10.100.0.1").port == 22


def _vm() -> hp.VmSpec:
    b = hp.SlotBundle(0, "0000:1b:00.0", None, "/dev/disk/by-id/nvme-S0", "52:54:00:00:00:01", "10.100.0.10", 0)
    return hp.VmSpec("alloc-1", "acme", (b,), vcpu_count=2, memory_mib=1024)


def test_the_seed_installs_the_announcer_only_when_asked() -> None:
    announce = protocols.GuestAnnounce("http://10.100.0.1:8479/v1/slice-ready", f"name={NAME}&token={'a' * 32}")
    plain = json.loads(cloudinit.render(_vm())["user-data"].decode().split("\n", 1)[1])
    assert "write_files" not in plain and "runcmd" not in plain
    doc = json.loads(cloudinit.render(_vm(), announce=announce)["user-data"].decode().split("\n", 1)[1])
    files = {f["path"]: f for f in doc["write_files"]}
    assert files[cloudinit.ANNOUNCE_URL]["content"] == announce.url
    assert files[cloudinit.ANNOUNCE_BODY]["content"] == announce.body
    assert files[cloudinit.ANNOUNCE_BODY]["permissions"] == "0600"
    assert files[cloudinit.ANNOUNCER]["content"] == cloudinit.ANNOUNCER_SCRIPT
    assert f"ExecStart={cloudinit.ANNOUNCER}" in files[f"/etc/systemd/system/{cloudinit.UNIT}"]["content"]
    assert doc["runcmd"][-1] == ["systemctl", "enable", "--now", "--no-block", cloudinit.UNIT]
    # the values are data files: none of them appears in the script
    assert announce.url not in cloudinit.ANNOUNCER_SCRIPT and "token" not in cloudinit.ANNOUNCER_SCRIPT


@pytest.mark.integration
def test_the_seeds_announcer_runs_under_busybox(tmp_path: Path, heard: guestmarker.Announcements) -> None:
    """The script the seed installs, under busybox sh with busybox wget (no curl), as the e2e guest runs it."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox not installed")
    announce = heard.announce_for(NAME, "127.0.0.1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "sleep", "wget"):
        (bin_dir / tool).symlink_to(busybox)
    marker, url_file, body_file = tmp_path / "slice-ready", tmp_path / "url", tmp_path / "body"
    url_file.write_text(announce.url)
    body_file.write_text(announce.body)
    script = (
        cloudinit.ANNOUNCER_SCRIPT.replace(protocols.GUEST_MARKER, str(marker))
        .replace(cloudinit.ANNOUNCE_URL, str(url_file))
        .replace(cloudinit.ANNOUNCE_BODY, str(body_file))
    )
    proc = subprocess.Popen([busybox, "sh", "-c", script], env={"PATH": str(bin_dir)})
    try:
        time.sleep(1.5)
        assert heard.heard(NAME) is None  # no marker yet: nothing said
        marker.write_text("")
        deadline = time.monotonic() + 15
        while heard.heard(NAME) is None:
            assert time.monotonic() < deadline, "the announcer never posted"
            time.sleep(0.1)
        h = heard.heard(NAME)
        assert h is not None and h.ip == "127.0.0.1"
    finally:
        proc.kill()
        proc.wait(timeout=10)
