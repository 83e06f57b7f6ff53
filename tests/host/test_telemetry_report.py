"""The agent reports each VM's newest guest telemetry sample with its status, keyed by allocation.

A lab host (loop disks, libvirt test driver); no guest boots here, so the
readiness driver is a stand-in behind its Protocol: it passes readiness at
once and holds one sample for the VM, as the listener would after a post.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from host_reconciler import converging, devicereports
from host_reconciler.drivers import protocols, wiring
from tests.host.conftest import Lab

SAMPLE = {"received_at": 1_800_000_000.0, "buffered": 1, "gpus": [{"index": 0, "utilization_pct": None}]}


class GuestStandIn:
    def __init__(self) -> None:
        self.expected: dict[str, str] = {}

    def announce_for(self, name: str, gateway: str) -> protocols.GuestAnnounce | None:
        return None

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
    ) -> protocols.ReadinessResult:
        return protocols.ReadinessResult(mac, ip, port, 0.0, 0.0)

    def guest_telemetry(self, expected: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        self.expected = dict(expected)
        return {name: SAMPLE for name in expected} | {"gpuaas-not-in-the-plan": SAMPLE}

    def refused(self) -> dict[str, int]:
        return {"bad_token": 2}

    def close(self) -> None:
        pass


def test_the_status_carries_the_newest_sample_per_allocation(lab: Lab) -> None:
    s = lab.settings()
    guest = GuestStandIn()
    drivers = dataclasses.replace(wiring.drivers(s), readiness=guest)
    vm = lab.vm("alloc-t", (1,))
    try:
        r = converging.Converger(s, drivers).converge(lab.plan(1, vms=(vm,)))
        assert not r.errors, r.errors
        assert guest.expected == {vm.name: "10.100.0.11"}  # its reserved address: posts from elsewhere refused
        assert r.status.telemetry == {"alloc-t": SAMPLE}  # a name outside the plan is not reported
        assert r.status.as_dict()["telemetry"]["alloc-t"]["gpus"][0]["utilization_pct"] is None
        assert r.status.as_dict()["guest_reports_refused"] == {"bad_token": 2}
    finally:
        drivers.close()
