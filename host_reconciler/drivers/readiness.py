"""The VM readiness gate: a slice is active only once its management endpoint answers.

Seed 000 ("VM Readiness Gate"): never assume readiness after a fixed wait.
Wait for the expected DHCP lease, then poll TCP :22 (or the image/profile's
management port), and fail with structured output when the timeout passes.
Seed 002 adds the guest marker `/var/lib/gpuaas/slice-ready`, bounded by the
Fleet's `readiness_timeout_seconds` (the plan's `readiness_timeout_s`), unless the VM's SKU or VM profile sets its own
(`VmSpec.readiness_timeout_s`, snapshotted with the claim).

`LeaseReadiness` does exactly that in stages sharing one deadline:
1. dnsmasq's lease file holds an unexpired lease for the VM's MAC with the
   reserved IP (a lease with another IP means the reservation was not in
   force when the guest asked, and keeps the gate shut);
2. a TCP connection to IP:port is accepted;
3. with `announcements` (`guestmarker.Announcements`), the guest announced
   its marker from the reserved IP with its own token: `announce_for` gives
   the seed what the guest must post. Without them (labs whose guests carry
   no announcer), the gate stops after stage 2 and asks the seed for nothing;
4. with an `expect` (the claim's GPU and fabric VF counts), the guest's
   device report (`devicereports`) came from the reserved IP and matches it.
   A report that does not match is a permanent failure
   (`host.readiness.device_mismatch`, the guest's words in the message): the
   allocation is placed elsewhere and the slots quarantined, as for the
   other readiness codes. No report in time is `host.readiness.devices_timeout`.

Clock, sleep and connect are injectable, so the timeout logic is tested
without real waits; the end-to-end test runs it against a booting guest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler import devicereports
from host_reconciler.drivers import addresses, dnsmasq, guestmarker, netns
from host_reconciler.drivers.protocols import GUEST_MARKER, GuestAnnounce, Lease, ReadinessResult
from schemas.errors import PermanentError, TemporaryError


class ReadinessTimeout(TemporaryError):
    """The VM did not become ready in time; `stage` says which step never passed."""

    code = host_codes.READINESS_TIMEOUT

    def __init__(self, message: str, *, code: str, stage: str, waited_s: float) -> None:
        super().__init__(message, code=code)
        self.stage = stage
        self.waited_s = waited_s


class DeviceMismatch(PermanentError):
    """The guest does not see the devices its claim gives it (permanent: reschedule and quarantine)."""

    code = host_codes.READINESS_DEVICE_MISMATCH

    def __init__(self, message: str, *, devices: dict[str, object]) -> None:
        super().__init__(message)
        self.devices = devices


Connect = Callable[[str, int, float], None]


class LeaseReadiness:
    """ReadinessDriver over a dnsmasq lease file and TCP connects (optionally in a netns)."""

    def __init__(
        self,
        lease_file: Path,
        *,
        netns_name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        connect: Connect | None = None,
        poll_s: float = 1.0,
        connect_timeout_s: float = 2.0,
        announcements: guestmarker.Announcements | None = None,
    ) -> None:
        self._lease_file = lease_file
        self._announcements = announcements
        self._netns = netns.checked(netns_name)
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._connect = connect or self._tcp_connect
        self._poll = poll_s
        self._connect_timeout = connect_timeout_s

    def announce_for(self, name: str, gateway: str) -> GuestAnnounce | None:
        if self._announcements is None:
            return None
        self._announcements.forget(name)  # a new seed: only what this VM says from now on counts
        return self._announcements.announce_for(name, gateway)

    def guest_telemetry(self, expected: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        if self._announcements is None:
            return {}
        self._announcements.expect_all(dict(expected))
        return self._announcements.latest_telemetry()

    def refused(self) -> dict[str, int]:
        return self._announcements.refused_counts() if self._announcements is not None else {}

    def close(self) -> None:
        if self._announcements is not None:
            self._announcements.close()

    def wait_ready(
        self,
        mac: str,
        ip: str,
        port: int,
        timeout_s: float,
        *,
        name: str | None = None,
        gateway: str | None = None,
        expect: devicereports.Expectation | None = None,
    ) -> ReadinessResult:
        mac = addresses.mac(mac)
        if self._announcements is not None and name is not None and gateway is not None:
            # A restarted agent listens again before it waits: the guest repeats its announcement.
            self._announcements.listen(str(addresses.ipv4(gateway)))
        ip = str(addresses.ipv4(ip))
        if not 0 < port < 65536:
            raise addresses.InvalidNetworkValue(f"not a TCP port: {port}", code=host_codes.NET_INVALID_PORT)
        start = self._clock()
        deadline = start + timeout_s

        seen: str | None = None
        while True:
            leases = [lease for lease in self._leases() if lease.mac == mac]
            if any(lease.ip == ip for lease in leases):
                break
            if leases:
                seen = leases[-1].ip
            self._wait_or_fail(
                deadline,
                start,
                stage="lease",
                code=host_codes.READINESS_LEASE_TIMEOUT,
                message=(
                    f"no DHCP lease for {mac} with {ip} after {timeout_s:g}s" + (f" (it holds {seen})" if seen else "")
                ),
            )
        lease_s = self._clock() - start

        last_error = "no attempt"
        while True:
            remaining = deadline - self._clock()
            try:
                self._connect(ip, port, max(0.1, min(self._connect_timeout, remaining)))
                break
            except OSError as e:
                last_error = e.strerror or type(e).__name__
            self._wait_or_fail(
                deadline,
                start,
                stage="port",
                code=host_codes.READINESS_PORT_TIMEOUT,
                message=f"{ip}:{port} not accepting after {timeout_s:g}s ({last_error})",
            )
        if self._announcements is not None and name is not None:
            self._announcements.expect(name, ip)  # device reports from any other address are refused
            self._wait_marker(self._announcements, name, ip, deadline=deadline, start=start, timeout_s=timeout_s)
            if expect is not None:
                found = self._wait_devices(
                    self._announcements, name, ip, expect, deadline=deadline, start=start, timeout_s=timeout_s
                )
                now = self._clock() - start
                return ReadinessResult(mac, ip, port, lease_s, now, devices_s=now, devices=found.as_dict())
        return ReadinessResult(mac, ip, port, lease_s, self._clock() - start)

    def _wait_devices(
        self,
        heard: guestmarker.Announcements,
        name: str,
        ip: str,
        expect: devicereports.Expectation,
        *,
        deadline: float,
        start: float,
        timeout_s: float,
    ) -> devicereports.GuestDevices:
        while True:
            h = heard.devices(name)
            if h is not None and h.ip == ip:
                problems = devicereports.compare(expect, h.devices)
                if problems:
                    raise DeviceMismatch(
                        f"{name}: {'; '.join(problems)}; the guest said: {h.devices.words[:500] or '(nothing)'}",
                        devices=h.devices.as_dict(),
                    )
                return h.devices
            self._wait_or_fail(
                deadline,
                start,
                stage="devices",
                code=host_codes.READINESS_DEVICES_TIMEOUT,
                message=f"{name} sent no device report from {ip} after {timeout_s:g}s "
                f"(GPU tool output and fabric port states; is nvidia-smi in the image?)",
            )

    def _wait_marker(
        self, heard: guestmarker.Announcements, name: str, ip: str, *, deadline: float, start: float, timeout_s: float
    ) -> None:
        other: str | None = None
        while True:
            h = heard.heard(name)
            if h is not None and h.ip == ip:
                return
            if h is not None:
                other = h.ip
            self._wait_or_fail(
                deadline,
                start,
                stage="marker",
                code=host_codes.READINESS_MARKER_TIMEOUT,
                message=(
                    f"{name} did not announce {GUEST_MARKER} from {ip} after {timeout_s:g}s"
                    + (f" (an announcement came from {other})" if other else "")
                ),
            )

    def _leases(self) -> Sequence[Lease]:
        now = self._wall()
        return [lease for lease in dnsmasq.read_leases(self._lease_file) if lease.expires == 0 or lease.expires > now]

    def _wait_or_fail(self, deadline: float, start: float, *, stage: str, code: str, message: str) -> None:
        now = self._clock()
        if now >= deadline:
            raise ReadinessTimeout(message, code=code, stage=stage, waited_s=now - start)
        self._sleep(min(self._poll, deadline - now))

    def _tcp_connect(self, ip: str, port: int, timeout: float) -> None:
        netns.connect(self._netns, (ip, port), timeout)
