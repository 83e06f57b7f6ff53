"""Gauges for alerting, labelled so an alert can say where: per node, per region x SKU.

`gpuaas serve`'s /metrics (reconciler.service.metrics) adds these to its
fleet totals. An alert needs the `node` that went silent and the `sku` whose
capacity ran out, not a count per state:

    gpuaas_node_live{node,region}                        1 live, 0 silent past the TTL (never reported: absent)
    gpuaas_node_last_report_timestamp_seconds{node,region}
    gpuaas_node_converge_errors{node,region}             errors in the host's newest report
    gpuaas_sku_allocations{region,sku,state}             allocations by state
    gpuaas_allocations_pending_oldest_seconds{region,sku}  age of the oldest request still pending
    gpuaas_sku_units{region,sku,unit,state}              slots (or whole nodes): total, in_use, free, usable
    gpuaas_sku_gpus{region,sku,state}                    GPUs: total, used, free, launchable
    gpuaas_build_info{version,python}                    1

The SKU families come from the capacity cache (what `status` computes), read
as it stands: a scrape never plans. Everything else is one round of
aggregate queries in the scrape's read-only transaction (the fleet totals'
collector calls `read`); when the store cannot be read these are left out
and `gpuaas_database_up` says why.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from reconciler.store.connections import Connection
from schemas import dberrors


def _family(name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        g.add_metric(values, value)
    return g


def read(conn: Connection) -> list[Metric]:
    """The per-node and per-SKU gauges the store answers (inside the scrape's transaction)."""
    with dberrors.wrapped("read labelled gauges"):
        nodes = conn.execute(
            "SELECT n.name, n.region, l.liveness, extract(epoch FROM l.reported_at)::float8,"
            " CASE WHEN jsonb_typeof(h.errors) = 'array' THEN jsonb_array_length(h.errors) END"
            " FROM nodes n JOIN node_liveness l ON l.node_name = n.name"
            " LEFT JOIN host_status h ON h.node_name = n.name WHERE n.present ORDER BY n.name"
        ).fetchall()
        allocations = conn.execute(
            "SELECT region, sku, status, count(*) FROM allocations WHERE present OR status <> 'pending'"
            " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        ).fetchall()
        pending = conn.execute(
            "SELECT region, sku, extract(epoch FROM max(now() - requested_at))::float8 FROM allocations"
            " WHERE status = 'pending' AND present AND desired_state = 'present' GROUP BY 1, 2 ORDER BY 1, 2"
        ).fetchall()
    return [
        _family(
            "gpuaas_node_live",
            "1 while the node's host reports within the liveness TTL, 0 once silent past it"
            " (a node whose host never reported has no sample)",
            ["node", "region"],
            [([n, r], 1.0 if state == "live" else 0.0) for n, r, state, _, _ in nodes if state != "unknown"],
        ),
        _family(
            "gpuaas_node_last_report_timestamp_seconds",
            "Unix time of the newest report of the node's host",
            ["node", "region"],
            [([n, r], at) for n, r, _, at, _ in nodes if at is not None],
        ),
        _family(
            "gpuaas_node_converge_errors",
            "Errors in the newest report of the node's host (steps that failed)",
            ["node", "region"],
            [([n, r], float(e)) for n, r, _, _, e in nodes if e is not None],
        ),
        _family(
            "gpuaas_sku_allocations",
            "Allocations by region, SKU and state",
            ["region", "sku", "state"],
            [([str(r), str(s), str(st)], float(c)) for r, s, st, c in allocations],
        ),
        _family(
            "gpuaas_allocations_pending_oldest_seconds",
            "Seconds since the oldest still-pending request of the region and SKU was made",
            ["region", "sku"],
            [([str(r), str(s)], float(age)) for r, s, age in pending],
        ),
    ]


def capacity(doc: dict[str, Any], gpus_per_node: dict[str, int]) -> Iterator[Metric]:
    """Units and GPUs per region x SKU from a capacity document (`status`'s `capacity` list)."""
    units = GaugeMetricFamily(
        "gpuaas_sku_units",
        "Sellable units (slots, or whole nodes for baremetal SKUs) by "
        "state: total, in_use, free, usable (free and launchable now)",
        labels=["region", "sku", "unit", "state"],
    )
    gpus = GaugeMetricFamily(
        "gpuaas_sku_gpus",
        "GPUs by state: total, used, free, launchable (in usable units)",
        labels=["region", "sku", "state"],
    )
    for o in doc["capacity"]:
        per = gpus_per_node.get(o["sku"], 8) if o["unit"] == "node" else 1
        for state in ("total", "in_use", "free", "usable"):
            units.add_metric([o["region"], o["sku"], o["unit"], state], o[state])
        for state, key in (("total", "total"), ("used", "in_use"), ("free", "free"), ("launchable", "usable")):
            gpus.add_metric([o["region"], o["sku"], state], o[key] * per)
    yield units
    yield gpus


def gpus_per_node(conn: Connection) -> dict[str, int]:
    """GPUs of one whole node per baremetal SKU (its `gpu_count`)."""
    with dberrors.wrapped("read SKU GPU counts"):
        rows = conn.execute("SELECT sku, gpu_count FROM sku_catalog WHERE gpu_count IS NOT NULL").fetchall()
    return {str(s): int(n) for s, n in rows}


def build_info() -> GaugeMetricFamily:
    g = GaugeMetricFamily(
        "gpuaas_build_info", "The running gpuaas: its version and Python (always 1)", labels=["version", "python"]
    )
    g.add_metric([version(), platform.python_version()], 1)
    return g


@functools.cache
def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gpuaas-reconciler")
    except metadata.PackageNotFoundError:
        return "unknown"
