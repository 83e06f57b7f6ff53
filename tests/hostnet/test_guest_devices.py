"""Readiness proves the devices: the guest reports what it sees, the gate compares it with the claim.

    guest: the seed's announcer (busybox sh)            host agent
    stand-in nvidia-smi -L  ──report (name, token)──▶   Announcements (127.0.0.1 here)
                                                        LeaseReadiness stage 4: count, UUIDs, fabric

The real nvidia-smi cannot run without a GPU: a script prints what it prints.
The listener is real (127.0.0.1, an ephemeral port), as is the announcer script.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_reconciler import cloudinit, devicereports
from host_reconciler.drivers import guestmarker, protocols, readiness

from .test_guest_marker import NAME, SECRET, post
from .test_readiness import MAC, _accept, _lease

NVIDIA_SMI_L = (
    "GPU 0: NVIDIA H200 (UUID: GPU-2f6c1d3e-8a4b-4c55-9d1e-0b7a6f3e2c11)\n"
    "GPU 1: NVIDIA H200 (UUID: GPU-7a9e0c42-1b3d-4f6a-8e2c-5d4b3a2f1e00)\n"
)
AMD_SMI_LIST = "GPU: 0\n    BDF: 0000:05:00.0\n    UUID: 1fff74a1-0000-1000-80ab-1c2d3e4f5a6b\n"
ROCM_SMI = "GPU[0]\t\t: Unique ID: 0x18f68e602b8a790f\nGPU[1]\t\t: Unique ID: 0x2a1b3c4d5e6f7081\n"


@pytest.fixture
def heard() -> Iterator[guestmarker.Announcements]:
    a = guestmarker.Announcements(SECRET, port=0)
    try:
        yield a
    finally:
        a.close()


def report(token: str, words: str, *, tool: str = "nvidia-smi", fabric: str = "", name: str = NAME) -> bytes:
    return f"gpuaas-devices 1\nname {name}\ntoken {token}\ntool {tool}\n{fabric}smi-begin\n{words}smi-end\n".encode()


@pytest.mark.parametrize(
    ("tool", "words", "fabric", "count", "ports"),
    [
        (
            "nvidia-smi",
            NVIDIA_SMI_L,
            "fabric mlx5_0.1 4: ACTIVE\nfabric mlx5_1.1 1: DOWN\n",
            2,
            (("mlx5_0.1", "ACTIVE"), ("mlx5_1.1", "DOWN")),
        ),
        ("amd-smi", AMD_SMI_LIST, "", 1, ()),
        ("rocm-smi", ROCM_SMI, "", 2, ()),
        ("nvidia-smi", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "", 0, ()),
        ("none", "", "", 0, ()),
    ],
)
def test_parse(tool: str, words: str, fabric: str, count: int, ports: tuple[tuple[str, str], ...]) -> None:
    name, token, got = devicereports.parse(report("a" * 32, words, tool=tool, fabric=fabric))
    assert (name, token, got.tool, got.gpu_count, got.fabric) == (NAME, "a" * 32, tool, count, ports)
    assert got.words == words.strip()


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"x" * (devicereports.MAX_BYTES + 1), "oversized"),
        (b"\xff\xfe", "malformed"),
        (b"hello", "malformed"),
        (report("a" * 31, ""), "malformed"),
        (report("a" * 32, "").replace(b"smi-begin", b"begin"), "malformed"),
        (report("a" * 32, "", fabric="fabric mlx5_0.1 $(reboot)\n"), "malformed"),
        (report("a" * 32, "", tool="bash"), "malformed"),
    ],
)
def test_parse_refuses(body: bytes, code: str) -> None:
    with pytest.raises(devicereports.DeviceReportRefused) as e:
        devicereports.parse(body)
    assert e.value.code == code


def test_compare() -> None:
    _, _, two = devicereports.parse(report("a" * 32, NVIDIA_SMI_L, fabric="fabric mlx5_0.1 4: ACTIVE\n"))
    assert devicereports.compare(devicereports.Expectation(2, 1), two) == []
    assert devicereports.compare(devicereports.Expectation(4, 1), two) == [
        "the guest sees 2 GPU(s) with nvidia-smi, the claim gives 4"
    ]
    assert (
        "0 fabric port(s) ACTIVE"
        in devicereports.compare(
            devicereports.Expectation(2, 1), devicereports.parse(report("a" * 32, NVIDIA_SMI_L))[2]
        )[0]
    )


def test_refused_reports_are_counted_and_never_stored(heard: guestmarker.Announcements) -> None:
    announce = heard.announce_for(NAME, "127.0.0.1")
    url = announce.devices_url
    assert url.endswith(guestmarker.DEVICES_PATH) and f"token {heard.token(NAME)}" in announce.devices_head
    other = heard.token("gpuaas-alloc-2")  # another allocation's token
    assert post(url, report(other, NVIDIA_SMI_L), guestmarker.DEVICES_PATH) == 403
    heard.expect(NAME, "10.100.0.10")  # the VM's reserved address; this post comes from 127.0.0.1
    assert post(url, report(heard.token(NAME), NVIDIA_SMI_L), guestmarker.DEVICES_PATH) == 403
    assert post(url, b"gpuaas-devices 1\n" + b"x" * (devicereports.MAX_BYTES + 10), guestmarker.DEVICES_PATH) == 413
    assert post(url, b"name=x&token=y", guestmarker.DEVICES_PATH) == 400
    assert heard.devices(NAME) is None
    assert heard.refused == {"bad_token": 1, "wrong_source": 1, "oversized": 1, "malformed": 1}
    heard.expect(NAME, "127.0.0.1")
    assert post(url, report(heard.token(NAME), NVIDIA_SMI_L), guestmarker.DEVICES_PATH) == 204
    stored = heard.devices(NAME)
    assert stored is not None and stored.devices.gpu_count == 2 and stored.ip == "127.0.0.1"


def _announcer(
    tmp_path: Path, announce: protocols.GuestAnnounce, smi_output: str, *, smi_script: str | None = None
) -> subprocess.Popen[bytes]:
    """The seed's announcer under busybox sh, its paths moved into tmp_path, a stand-in nvidia-smi on PATH."""
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "sleep", "wget", "head", "sed"):
        (bin_dir / tool).symlink_to(busybox)
    (tmp_path / "smi-output").write_text(smi_output)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        f"#!{busybox} sh\n" + (smi_script or f'[ "$1" = -L ] || exit 2\ncat {tmp_path / "smi-output"}') + "\n"
    )
    smi.chmod(0o755)
    paths = {
        protocols.GUEST_MARKER: tmp_path / "slice-ready",
        cloudinit.ANNOUNCE_URL: tmp_path / "url",
        cloudinit.ANNOUNCE_BODY: tmp_path / "body",
        cloudinit.DEVICES_URL: tmp_path / "devices-url",
        cloudinit.DEVICES_HEAD: tmp_path / "devices-head",
        cloudinit.DEVICES_REPORT: tmp_path / "report",
        cloudinit.TELEMETRY_URL: tmp_path / "telemetry-url",
        cloudinit.TELEMETRY_HEAD: tmp_path / "telemetry-head",
        cloudinit.TELEMETRY_REPORT: tmp_path / "telemetry",
    }
    paths[cloudinit.ANNOUNCE_URL].write_text(announce.url)
    paths[cloudinit.ANNOUNCE_BODY].write_text(announce.body)
    paths[cloudinit.DEVICES_URL].write_text(announce.devices_url)
    paths[cloudinit.DEVICES_HEAD].write_text(announce.devices_head)
    paths[cloudinit.TELEMETRY_URL].write_text(announce.telemetry_url)
    paths[cloudinit.TELEMETRY_HEAD].write_text(announce.telemetry_head)
    paths[protocols.GUEST_MARKER].write_text("")
    script = cloudinit.ANNOUNCER_SCRIPT
    for old, new in paths.items():
        script = script.replace(old, str(new))
    return subprocess.Popen([busybox, "sh", "-c", script], env={"PATH": str(bin_dir)})


@pytest.mark.integration
@pytest.mark.parametrize(("gpus_claimed", "matches"), [(2, True), (4, False)])
def test_the_gate_passes_only_when_the_guest_sees_the_claimed_gpus(
    tmp_path: Path, heard: guestmarker.Announcements, gpus_claimed: int, matches: bool
) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "127.0.0.1", expires=0)
    gate = readiness.LeaseReadiness(leases, connect=_accept, poll_s=0.1, announcements=heard)
    announce = gate.announce_for(NAME, "127.0.0.1")
    assert announce is not None
    proc = _announcer(tmp_path, announce, NVIDIA_SMI_L)
    try:
        expect = devicereports.Expectation(gpus_claimed, 0)
        if matches:
            result = gate.wait_ready(MAC, "127.0.0.1", 22, 30, name=NAME, gateway="127.0.0.1", expect=expect)
            assert result.devices is not None and result.devices["gpu_count"] == 2
            assert result.devices_s is not None and result.devices_s <= result.ready_s
        else:
            with pytest.raises(readiness.DeviceMismatch) as e:
                gate.wait_ready(MAC, "127.0.0.1", 22, 30, name=NAME, gateway="127.0.0.1", expect=expect)
            assert e.value.code == "host.readiness.device_mismatch"
            assert "the guest sees 2 GPU(s) with nvidia-smi, the claim gives 4" in e.value.message
            assert "GPU-2f6c1d3e" in e.value.message  # the guest's own words
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_no_device_report_is_a_devices_timeout(tmp_path: Path, heard: guestmarker.Announcements) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "127.0.0.1", expires=0)
    gate = readiness.LeaseReadiness(leases, connect=_accept, poll_s=0.05, announcements=heard)
    announce = gate.announce_for(NAME, "127.0.0.1")
    assert announce is not None
    assert post(announce.url, announce.body.encode()) == 204  # the marker, but no device report
    with pytest.raises(readiness.ReadinessTimeout) as e:
        gate.wait_ready(
            MAC, "127.0.0.1", 22, 0.5, name=NAME, gateway="127.0.0.1", expect=devicereports.Expectation(1, 0)
        )
    assert (e.value.code, e.value.stage) == ("host.readiness.devices_timeout", "devices")


# Recorded on a real H200 guest (the issue 35 device check): `nvidia-smi -L` and the telemetry query.
RECORDED_H200_L = "GPU 0: NVIDIA H200 (UUID: GPU-5d164a95-ebc5-1202-660e-fe927c12ae87)\n"
RECORDED_H200_QUERY = "0, GPU-5d164a95-ebc5-1202-660e-fe927c12ae87, 0, 0, 143771, 41, 0, 0\n"


def test_what_a_real_h200_guest_prints_parses() -> None:
    from host_reconciler import telemetry

    _, _, got = devicereports.parse(report("a" * 32, RECORDED_H200_L))
    assert (got.gpu_count, got.uuids) == (1, ("GPU-5d164a95-ebc5-1202-660e-fe927c12ae87",))
    assert devicereports.compare(devicereports.Expectation(1, 0), got) == []
    body = f"gpuaas-telemetry 1\nname {NAME}\ntoken {'a' * 32}\ngpu {RECORDED_H200_QUERY}".encode()
    gpu = telemetry.parse(body)[2].gpus[0]
    assert (gpu.utilization_pct, gpu.memory_used_mib, gpu.memory_total_mib, gpu.temperature_c) == (0, 0, 143771, 41)
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected) == (0, 0)  # a real 0 stays 0; only [N/A] is null
