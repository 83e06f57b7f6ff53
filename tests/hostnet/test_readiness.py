"""The readiness gate: lease first, then the TCP port, within one deadline.

Timeout logic runs on a fake clock (sleep advances it), over a real lease
file; the last test opens a real listener in a namespace.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from host_reconciler.drivers import netns, protocols, readiness
from host_reconciler.drivers.addresses import InvalidNetworkValue

from .conftest import Lab

MAC = "52:54:00:aa:00:01"
NOW = 1_800_000_000


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[float], None] = lambda t: None

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s
        self.on_sleep(self.t)


def _gate(lease_file: Path, clock: FakeClock, connect: readiness.Connect) -> readiness.LeaseReadiness:
    return readiness.LeaseReadiness(
        lease_file,
        clock=clock,
        wall_clock=lambda: NOW,
        sleep=clock.sleep,
        connect=connect,
        poll_s=1.0,
    )


def _refuse(ip: str, port: int, timeout: float) -> None:
    raise ConnectionRefusedError(111, "Connection refused")


def _accept(ip: str, port: int, timeout: float) -> None:
    return None


def _lease(path: Path, mac: str, ip: str, expires: int = NOW + 600) -> None:
    with path.open("a") as f:
        f.write(f"{expires} {mac} {ip} gpuaas-a1 01:{mac}\n")


def test_ready_when_lease_then_port_appear(tmp_path: Path) -> None:
    leases = tmp_path / "dnsmasq.leases"
    clock = FakeClock()
    attempts: list[float] = []

    def connect(ip: str, port: int, timeout: float) -> None:
        attempts.append(clock.t)
        assert (ip, port) == ("10.100.0.10", 2222)
        if clock.t < 110:
            raise ConnectionRefusedError(111, "Connection refused")

    clock.on_sleep = lambda t: _lease(leases, MAC, "10.100.0.10") if t == 104 else None
    result = _gate(leases, clock, connect).wait_ready(MAC.upper(), "10.100.0.10", 2222, 60)

    assert result == protocols.ReadinessResult(MAC, "10.100.0.10", 2222, lease_s=4.0, ready_s=10.0)
    assert attempts[0] == 104.0  # no TCP attempt before the lease
    assert all(s == 1.0 for s in clock.sleeps)


def test_lease_timeout_is_temporary_with_a_stage(tmp_path: Path) -> None:
    clock = FakeClock()
    with pytest.raises(readiness.ReadinessTimeout) as err:
        _gate(tmp_path / "none.leases", clock, _accept).wait_ready(MAC, "10.100.0.10", 22, 5.5)
    assert err.value.code == "host.readiness.lease_timeout"
    assert err.value.stage == "lease"
    assert err.value.waited_s == pytest.approx(5.5)
    assert clock.sleeps[-1] == pytest.approx(0.5)  # never sleeps past the deadline


def test_a_lease_on_another_ip_or_expired_does_not_count(tmp_path: Path) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "10.100.0.99")
    _lease(leases, MAC, "10.100.0.10", expires=NOW - 1)
    _lease(leases, "52:54:00:aa:00:02", "10.100.0.10")
    with pytest.raises(readiness.ReadinessTimeout) as err:
        _gate(leases, FakeClock(), _accept).wait_ready(MAC, "10.100.0.10", 22, 3)
    assert "it holds 10.100.0.99" in err.value.message


def test_port_timeout_names_the_last_error(tmp_path: Path) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "10.100.0.10", expires=0)  # 0: infinite lease
    with pytest.raises(readiness.ReadinessTimeout) as err:
        _gate(leases, FakeClock(), _refuse).wait_ready(MAC, "10.100.0.10", 22, 3)
    assert err.value.code == "host.readiness.port_timeout"
    assert err.value.stage == "port"
    assert "Connection refused" in err.value.message


@pytest.mark.parametrize(
    ("mac", "ip", "port", "code"),
    [
        ("52:54:00:aa:00", "10.100.0.10", 22, "host.net.invalid_mac"),
        (MAC, "10.100.0.300", 22, "host.net.invalid_ip"),
        (MAC, "10.100.0.10", 0, "host.net.invalid_port"),
        (MAC, "10.100.0.10", 70000, "host.net.invalid_port"),
    ],
)
def test_inputs_are_validated(tmp_path: Path, mac: str, ip: str, port: int, code: str) -> None:
    with pytest.raises(InvalidNetworkValue) as err:
        _gate(tmp_path / "l", FakeClock(), _accept).wait_ready(mac, ip, port, 1)
    assert err.value.code == code


@pytest.mark.root
def test_real_tcp_probe_inside_a_namespace(lab: Lab, tmp_path: Path) -> None:
    leases = tmp_path / "dnsmasq.leases"
    _lease(leases, MAC, "127.0.0.1", expires=0)
    gate = readiness.LeaseReadiness(leases, netns_name=lab.host, poll_s=0.05)

    with pytest.raises(readiness.ReadinessTimeout):
        gate.wait_ready(MAC, "127.0.0.1", 2222, 0.3)

    with netns.entered(lab.host):
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with server:
        server.bind(("127.0.0.1", 2222))
        server.listen(1)

        def accept_once() -> None:
            conn, _ = server.accept()
            conn.close()

        accepted = threading.Thread(target=accept_once, daemon=True)
        accepted.start()
        result = gate.wait_ready(MAC, "127.0.0.1", 2222, 5)
        accepted.join(5)
    assert result.port == 2222
    # The host namespace has no listener on 2222: the probe really ran in the lab's.
    with pytest.raises(OSError):
        netns.connect(None, ("127.0.0.1", 2222), 0.5)
