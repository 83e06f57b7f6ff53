"""The allocation lifecycle over HTTP (issue 15): `allocations/{id}` and the lifecycle gauges of /metrics.

Starts from the served example fleet (tests/service/conftest.py: alloc-0001
provisioning on h200-use1-s01 at phase "image"), then writes what hosts
report, as a host would, and reconciles with `gpuaas apply`, as the loop does.
"""

from __future__ import annotations

import pytest

from reconciler import cli
from reconciler.store import connections
from tests.claims import util
from tests.claims.test_lifecycle import NOT_VFIO, age_report, report_vm_failure
from tests.service.conftest import DRIFT_NODE, EXAMPLE, Served
from tests.service.test_metrics_usage import _by, _samples

ALLOC = "alloc-0001"


def _apply(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["apply", str(EXAMPLE), "--db-url", url]) == 0
    capsys.readouterr()


def _metrics(served: Served) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    status, _, body = served.get("/metrics")
    assert status == 200
    return _samples(body.decode())


def test_allocation_detail_carries_the_lifecycle(served: Served) -> None:
    a = served.json(f"/api/v1/allocations/{ALLOC}")
    c = a["lifecycle"]
    # placed, not yet advanced by a reconciliation; the host's current phase shows already
    assert (c["state"], c["host_phase"], c["host_vm_state"]) == ("reserved", "image", "provisioning")
    assert c["attempts"] == [] and c["failed_attempts"] == 0 and c["failure"] is None
    assert c["host_unreachable"] is False and c["boot_ip"] == a["boot_slot"]["private_ip"] is not None
    waiting = served.json("/api/v1/allocations/alloc-0007")["lifecycle"]
    assert waiting["state"] == "pending" and waiting["host_phase"] is None


def test_a_quarantine_shows_in_the_allocation_and_in_metrics(
    served: Served, fleet_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _metrics(served)
    assert before["gpuaas_slots_quarantined"][()] == 0
    assert _by(before["gpuaas_provision_attempts_failed_total"], "outcome") == {"rescheduled": 0, "failed": 0}
    slots = tuple(served.json(f"/api/v1/allocations/{ALLOC}")["slot_indexes"])
    with connections.connect(fleet_url, autocommit=True) as conn:
        report_vm_failure(conn, DRIFT_NODE, slots, ALLOC, *NOT_VFIO)
    _apply(fleet_url, capsys)

    a = served.json(f"/api/v1/allocations/{ALLOC}")
    c = a["lifecycle"]
    assert a["node"] not in (None, DRIFT_NODE) and c["state"] == "reserved" and c["failed_attempts"] == 1
    (attempt,) = c["attempts"]
    assert (
        attempt["attempt"],
        attempt["node"],
        attempt["slot_indexes"],
        attempt["phase"],
        attempt["code"],
        attempt["outcome"],
        attempt["quarantined"],
    ) == (1, DRIFT_NODE, list(slots), "vfio_check", "host.pci.not_vfio", "rescheduled", True)
    assert attempt["message"] == NOT_VFIO[2] and attempt["failed_at"]
    m = _metrics(served)
    assert m["gpuaas_slots_quarantined"][()] == len(slots)
    assert _by(m["gpuaas_provision_attempts_failed_total"], "outcome") == {"rescheduled": 1, "failed": 0}
    # the wipe proof frees the claims; the slot stays quarantined (and counted) until an operator clears it
    with connections.connect(fleet_url, autocommit=True) as conn:
        for s in slots:
            util.report_wipe(conn, DRIFT_NODE, s, ALLOC)
    _apply(fleet_url, capsys)
    assert _metrics(served)["gpuaas_slots_quarantined"][()] == len(slots)
    assert cli.main(["slot", "clear", DRIFT_NODE, str(slots[0]), "--db-url", fleet_url]) == 0
    assert _metrics(served)["gpuaas_slots_quarantined"][()] == len(slots) - 1


def test_a_silent_host_shows_in_liveness_and_its_allocations(served: Served, fleet_url: str) -> None:
    placed = [
        a["id"]
        for a in served.json(f"/api/v1/allocations?node={DRIFT_NODE}")["items"]
        if a["state"] in ("reserved", "provisioning", "active")
    ]
    assert ALLOC in placed
    with connections.connect(fleet_url, autocommit=True) as conn:
        reported = util.count(conn, "SELECT count(*) FROM host_status")
        present = util.count(conn, "SELECT count(*) FROM nodes WHERE present")
        conn.execute("UPDATE host_status SET reported_at = now()")
    m = _metrics(served)
    assert _by(m["gpuaas_nodes_liveness"], "state") == {
        "live": reported,
        "unavailable": 0,
        "disrupted": 0,
        "unknown": present - reported,
    }
    assert m["gpuaas_allocations_host_unreachable"][()] == 0

    with connections.connect(fleet_url, autocommit=True) as conn:
        age_report(conn, DRIFT_NODE, 91)  # past the default TTL (90 s)
    m = _metrics(served)
    assert _by(m["gpuaas_nodes_liveness"], "state") == {
        "live": reported - 1,
        "unavailable": 1,
        "disrupted": 0,
        "unknown": present - reported,
    }
    assert m["gpuaas_allocations_host_unreachable"][()] == len(placed)
    c = served.json(f"/api/v1/allocations/{ALLOC}")["lifecycle"]
    assert c["host_unreachable"] is True and c["state"] == "reserved"  # flagged, never released

    with connections.connect(fleet_url, autocommit=True) as conn:
        age_report(conn, DRIFT_NODE, 0)  # its next report
    m = _metrics(served)
    assert _by(m["gpuaas_nodes_liveness"], "state")["unavailable"] == 0
    assert m["gpuaas_allocations_host_unreachable"][()] == 0
    assert served.json(f"/api/v1/allocations/{ALLOC}")["lifecycle"]["host_unreachable"] is False
