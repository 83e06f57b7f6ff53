"""The host's readiness gate waits the VM's own timeout (VM profile > SKU), else the plan's Fleet-wide one.

A lab host (loop disks, libvirt test driver) runs the real provision steps;
the gate is the real LeaseReadiness over an empty dnsmasq lease file, on a
fake clock that its sleeps advance: no wall-clock wait.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from host_reconciler import converging
from host_reconciler.drivers import readiness, wiring
from tests.host.conftest import Lab


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.mark.parametrize(("own", "waited"), [(45, 45.0), (None, 300.0)])
def test_the_gate_times_out_after_the_vms_own_timeout(lab: Lab, tmp_path: Path, own: int | None, waited: float) -> None:
    s = lab.settings()
    clock = FakeClock()
    gate = readiness.LeaseReadiness(
        tmp_path / "dnsmasq.leases", clock=clock, wall_clock=lambda: 1_800_000_000.0, sleep=clock.sleep, poll_s=1.0
    )
    drivers = dataclasses.replace(wiring.drivers(s), readiness=gate)
    vm = dataclasses.replace(lab.vm("alloc-r", (1,)), readiness_timeout_s=own)
    try:
        r = converging.Converger(s, drivers).converge(lab.plan(1, vms=(vm,), readiness_timeout_s=300))
    finally:
        drivers.close()
    assert any("host.readiness.lease_timeout" in str(e) and f"after {waited:g}s" in str(e) for e in r.errors), r.errors
    assert clock.t - 100.0 == pytest.approx(waited, abs=1.0)  # it gave up at its own deadline, not another's
