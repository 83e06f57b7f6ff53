"""Guest GPU telemetry for the API and /metrics (seed 002 section 8; rows from migration 0056).

`GET /api/v1/allocations/{id}/telemetry` answers the newest sample its host
reported, or `"state": "unavailable"` with the reason (no sample yet: the
image has no nvidia-smi, or the guest has not reported; the sample is older
than `FRESH_S`: the guest or its host went quiet; the allocation is not
running). A field the guest could not read is null, never 0. /metrics
exports fresh samples only, one series per allocation and GPU, and leaves a
null field out instead of writing 0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from psycopg.rows import dict_row

from reconciler.store.connections import Connection
from schemas import dberrors

FRESH_S = 300.0  # a sample older than this is "unavailable: stale" (the guest posts every 30 s)
_RUNNING = ("provisioning", "active")

_SQL = """
SELECT t.allocation_id, t.node_name, t.received_at, t.reported_at, t.sample,
       extract(epoch FROM now() - t.received_at) AS age_s
FROM allocation_telemetry t WHERE t.allocation_id = ANY(%(ids)s) OR %(all)s
ORDER BY t.allocation_id, t.received_at DESC
"""


def _latest(conn: Connection, ids: list[str] | None) -> dict[str, dict[str, Any]]:
    with dberrors.wrapped("read guest telemetry"):
        rows = conn.cursor(row_factory=dict_row).execute(_SQL, {"ids": ids or [], "all": ids is None}).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out.setdefault(str(r["allocation_id"]), r)  # newest first: keep the first of each allocation
    return out


def allocation(conn: Connection, allocation_id: str) -> dict[str, Any] | None:
    """The telemetry document of one allocation (None: no such allocation)."""
    with dberrors.wrapped("read an allocation's state"):
        row = conn.execute("SELECT status::text FROM allocations WHERE id = %s", (allocation_id,)).fetchone()
    if row is None:
        return None
    status = str(row[0])
    doc: dict[str, Any] = {
        "allocation_id": allocation_id,
        "allocation_state": status,
        "state": "unavailable",
        "reason": None,
        "node": None,
        "received_at": None,
        "age_s": None,
        "gpus": [],
    }
    r = _latest(conn, [allocation_id]).get(allocation_id)
    if r is None:
        doc["reason"] = "no sample: the guest has not reported GPU telemetry (no nvidia-smi in the image?)"
        return doc
    age = float(r["age_s"])
    doc.update(node=r["node_name"], received_at=r["received_at"].isoformat(), age_s=round(age, 1))
    gpus = r["sample"].get("gpus") if isinstance(r["sample"], dict) else None
    doc["gpus"] = gpus if isinstance(gpus, list) else []
    if status not in _RUNNING:
        doc["reason"] = f"the allocation is {status}; the last sample is kept"
    elif age > FRESH_S:
        doc["reason"] = f"stale: the newest sample is {age:.0f} s old (fresh: {FRESH_S:.0f} s)"
    else:
        doc["state"] = "available"
    return doc


_SERIES = (
    ("gpuaas_allocation_gpu_utilization_ratio", "GPU utilisation the guest reports (0-1)", "utilization_pct", 0.01),
    (
        "gpuaas_allocation_gpu_memory_used_bytes",
        "GPU memory in use, as the guest reports it",
        "memory_used_mib",
        1 << 20,
    ),
    ("gpuaas_allocation_gpu_memory_total_bytes", "GPU memory, as the guest reports it", "memory_total_mib", 1 << 20),
    ("gpuaas_allocation_gpu_temperature_celsius", "GPU temperature the guest reports", "temperature_c", 1.0),
    (
        "gpuaas_allocation_gpu_ecc_corrected_errors",
        "Volatile corrected ECC errors the guest reports",
        "ecc_corrected",
        1.0,
    ),
    (
        "gpuaas_allocation_gpu_ecc_uncorrected_errors",
        "Volatile uncorrected ECC errors the guest reports",
        "ecc_uncorrected",
        1.0,
    ),
)


def families(conn: Connection) -> Iterator[Metric]:
    """Fresh samples of running allocations, by allocation and GPU index; a null field is no series."""
    with dberrors.wrapped("read running allocations"):
        running = [
            str(r[0])
            for r in conn.execute(
                "SELECT id FROM allocations WHERE status::text = ANY(%s)", (list(_RUNNING),)
            ).fetchall()
        ]
    latest = _latest(conn, running) if running else {}
    fams = {name: GaugeMetricFamily(name, doc, labels=["allocation", "gpu"]) for name, doc, _f, _s in _SERIES}
    age = GaugeMetricFamily(
        "gpuaas_allocation_telemetry_age_seconds", "Age of the newest guest telemetry sample", labels=["allocation"]
    )
    for alloc, r in sorted(latest.items()):
        age.add_metric([alloc], float(r["age_s"]))
        if float(r["age_s"]) > FRESH_S:
            continue
        gpus = r["sample"].get("gpus") if isinstance(r["sample"], dict) else None
        for gpu in gpus if isinstance(gpus, list) else []:
            if not isinstance(gpu, dict) or not isinstance(gpu.get("index"), int):
                continue
            for name, _doc, field, scale in _SERIES:
                value = gpu.get(field)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    fams[name].add_metric([alloc, str(gpu["index"])], value * scale)
    yield age
    yield from fams.values()
