"""Guest GPU telemetry: the host agent's report reaches the central store, the API and /metrics.

    host agent (node role, RLS) ── write_status(telemetry) ──▶ allocation_telemetry (0056)
    serve: GET /api/v1/allocations/{id}/telemetry, /metrics with the allocation label

A field the guest could not read stays null in the API and is no series in
/metrics: "unavailable", never 0.
"""

from __future__ import annotations

import time

from host_reconciler import hostdb
from host_reconciler.actions import DriftMode
from host_reconciler.statuses import HostStatus
from reconciler.store import connections
from tests.service.conftest import DRIFT_NODE, Served
from tests.service.test_metrics_usage import _samples

GPU = {
    "index": 0,
    "uuid": "GPU-2f6c1d3e-8a4b-4c55-9d1e-0b7a6f3e2c11",
    "utilization_pct": 87,
    "memory_used_mib": 40960,
    "memory_total_mib": 143771,
    "temperature_c": 61,
    "ecc_corrected": 0,
    "ecc_uncorrected": None,
}


def _report(url: str, sample: dict[str, object]) -> None:
    """What node h200-use1-s01's agent writes: its status, with one allocation's newest sample."""
    with connections.connect(url, autocommit=True) as conn:
        creds = hostdb.create_node_role(conn, DRIFT_NODE, "pw-telemetry")
    status = HostStatus(
        DRIFT_NODE, 1, 1, DriftMode.REPORT, True, True, (), (), (), (), (), telemetry={"alloc-0001": sample}
    )
    with hostdb.connect(url, role=creds.role, password=creds.password) as conn:
        hostdb.write_status(conn, status)


def test_a_guest_sample_is_served_per_allocation_and_exported(served: Served, fleet_url: str) -> None:
    with connections.connect(fleet_url, autocommit=True) as conn:
        conn.execute("UPDATE allocations SET status = 'active' WHERE id = 'alloc-0001'")
    none_yet = served.json("/api/v1/allocations/alloc-0001/telemetry")
    assert none_yet["state"] == "unavailable" and none_yet["reason"].startswith("no sample")
    _report(fleet_url, {"received_at": time.time(), "buffered": 1, "gpus": [GPU]})

    doc = served.json("/api/v1/allocations/alloc-0001/telemetry")
    assert (doc["state"], doc["node"], doc["gpus"]) == ("available", DRIFT_NODE, [GPU])
    assert doc["gpus"][0]["ecc_uncorrected"] is None  # unavailable, not 0
    m = _samples(served.get("/metrics")[2].decode())
    key = (("allocation", "alloc-0001"), ("gpu", "0"))
    assert m["gpuaas_allocation_gpu_utilization_ratio"][key] == 0.87
    assert m["gpuaas_allocation_gpu_memory_used_bytes"][key] == 40960 * (1 << 20)
    assert m["gpuaas_allocation_gpu_ecc_corrected_errors"][key] == 0
    assert key not in m.get("gpuaas_allocation_gpu_ecc_uncorrected_errors", {})  # no series, never a 0
    assert served.json("/api/v1/allocations/nope/telemetry", status=404)["error"]["code"] == "api.not_found"

    with connections.connect(fleet_url, autocommit=True) as conn:
        conn.execute("UPDATE allocation_telemetry SET received_at = now() - interval '1 hour'")
    stale = served.json("/api/v1/allocations/alloc-0001/telemetry")
    assert stale["state"] == "unavailable" and stale["reason"].startswith("stale") and stale["gpus"] == [GPU]
    m = _samples(served.get("/metrics")[2].decode())
    assert key not in m.get("gpuaas_allocation_gpu_utilization_ratio", {})
    assert m["gpuaas_allocation_telemetry_age_seconds"][(("allocation", "alloc-0001"),)] >= 3600


def test_an_older_sample_never_replaces_a_newer_one(fleet_url: str) -> None:
    now = time.time()
    _report(fleet_url, {"received_at": now, "gpus": [GPU]})
    _report(fleet_url, {"received_at": now - 60, "gpus": [{**GPU, "utilization_pct": 1}]})
    with connections.connect(fleet_url, autocommit=True) as conn:
        row = conn.execute("SELECT sample FROM allocation_telemetry WHERE allocation_id = 'alloc-0001'").fetchone()
    assert row is not None and row[0]["gpus"][0]["utilization_pct"] == 87
