"""Guest GPU telemetry on the host: parsed, refused when it should be, buffered, rate-limited.

guest: the seed's announcer (busybox sh), a stand-in nvidia-smi --query-gpu
    ──POST /v1/slice-telemetry (name, token)──▶ Announcements (127.0.0.1)
the agent's pass: LeaseReadiness.guest_telemetry({vm name: reserved IP}) -> newest sample per VM
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_reconciler import cloudinit, telemetry
from host_reconciler.drivers import guestmarker, readiness

from .test_guest_devices import NVIDIA_SMI_L, _announcer
from .test_guest_marker import NAME, SECRET, post
from .test_readiness import FakeClock

QUERY = "0, GPU-2f6c1d3e-8a4b-4c55-9d1e-0b7a6f3e2c11, 87, 40960, 143771, 61, 0, [N/A]\n"


def body(token: str, lines: str = QUERY, name: str = NAME) -> bytes:
    gpus = "".join(f"gpu {line}\n" for line in lines.splitlines())
    return f"gpuaas-telemetry 1\nname {name}\ntoken {token}\n{gpus}".encode()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def heard(clock: FakeClock) -> Iterator[guestmarker.Announcements]:
    a = guestmarker.Announcements(SECRET, port=0, clock=clock)
    try:
        yield a
    finally:
        a.close()


def test_parse_keeps_unavailable_fields_null() -> None:
    name, _token, sample = telemetry.parse(body("a" * 32))
    gpu = sample.gpus[0]
    assert (name, gpu.utilization_pct, gpu.memory_used_mib, gpu.temperature_c) == (NAME, 87, 40960, 61)
    assert gpu.ecc_corrected == 0 and gpu.ecc_uncorrected is None  # "[N/A]": unavailable, never 0
    for bad in (
        b"x" * (telemetry.MAX_BYTES + 1),
        b"gpuaas-telemetry 1\nname x\n",
        body("a" * 32, "0, a, b\n"),
        body("a" * 32, QUERY + QUERY),
    ):
        with pytest.raises(telemetry.TelemetryRefused):
            telemetry.parse(bad)


def test_bad_posts_are_refused_counted_and_never_kept(heard: guestmarker.Announcements, clock: FakeClock) -> None:
    announce = heard.announce_for(NAME, "127.0.0.1")
    url, path = announce.telemetry_url, guestmarker.TELEMETRY_PATH
    assert post(url, body(heard.token(NAME)), path) == 403  # no VM of the plan has this name yet
    heard.expect_all({NAME: "10.100.0.10"})
    assert post(url, body(heard.token(NAME)), path) == 403  # from 127.0.0.1, not the VM's address
    heard.expect_all({NAME: "127.0.0.1"})
    assert post(url, body(heard.token("gpuaas-alloc-2")), path) == 403  # another allocation's token
    assert post(url, b"gpuaas-telemetry 1\n" + b"x" * telemetry.MAX_BYTES, path) == 413
    assert post(url, b"{}", path) == 400
    assert heard.latest_telemetry() == {}
    assert post(url, body(heard.token(NAME)), path) == 204
    assert post(url, body(heard.token(NAME)), path) == 429  # within MIN_INTERVAL_S of the last one
    assert heard.refused == {
        "telemetry.wrong_source": 2,
        "telemetry.bad_token": 1,
        "telemetry.oversized": 1,
        "telemetry.malformed": 1,
        "telemetry.rate_limited": 1,
    }
    for _ in range(telemetry.BUFFER + 3):
        clock.sleep(telemetry.MIN_INTERVAL_S)
        assert post(url, body(heard.token(NAME)), path) == 204
    latest = heard.latest_telemetry()[NAME]
    assert latest["buffered"] == telemetry.BUFFER and latest["gpus"][0]["ecc_uncorrected"] is None  # type: ignore[index]


@pytest.mark.integration
def test_the_announcer_posts_telemetry_the_agent_reports(tmp_path: Path) -> None:
    heard = guestmarker.Announcements(SECRET, port=0)
    gate = readiness.LeaseReadiness(tmp_path / "leases", announcements=heard)
    try:
        announce = gate.announce_for(NAME, "127.0.0.1")
        assert announce is not None
        assert gate.guest_telemetry({NAME: "127.0.0.1"}) == {}
        smi = f"""case "$1" in -L) printf '%s' '{NVIDIA_SMI_L}';; --query-gpu=*) printf '%s' '{QUERY}';; esac"""
        proc = _announcer(tmp_path, announce, "", smi_script=smi)
        try:
            deadline = time.monotonic() + 20
            while not (got := gate.guest_telemetry({NAME: "127.0.0.1"})):
                assert time.monotonic() < deadline, "the announcer never posted telemetry"
                time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait(timeout=10)
        gpu = got[NAME]["gpus"][0]
        assert (gpu["utilization_pct"], gpu["ecc_uncorrected"]) == (87, None)
        assert cloudinit.TELEMETRY_QUERY in cloudinit.ANNOUNCER_SCRIPT
    finally:
        gate.close()
