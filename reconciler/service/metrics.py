"""/metrics: a Prometheus collector that reads the store at scrape time.

Nothing is counted in this process: every sample comes from PostgreSQL in
one read-only transaction per scrape (the fleet totals and the labelled
gauges of `fleetgauges` alike), so any number of `serve` replicas
report the same values and a restart loses nothing. Counters only go up
(Prometheus reads a drop as a restart and `increase()` invents runs): a run
in progress is the gauge `gpuaas_reconciliations_running`, never a counter
label. Launchable capacity
comes from the capacity cache (`statuscache`), never computed inside a
scrape; its age is exported beside it. When the database cannot be read
the scrape still succeeds with `gpuaas_database_up 0`.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from reconciler.service import fleetgauges, reads, statuscache, telemetries
from reconciler.service.pool import Pool
from reconciler.store import endpoints, history, leases, lifecycle
from schemas.errors import GpuaasError

log = logging.getLogger("gpuaas.serve")


def _gauge(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        g.add_metric(list(key), value)
    return g


class StoreCollector(Collector):
    def __init__(self, pool: Pool, capacity: statuscache.Cache) -> None:
        self._pool = pool
        self._capacity = capacity

    def collect(self) -> Iterator[Metric]:
        yield fleetgauges.build_info()
        up = GaugeMetricFamily("gpuaas_database_up", "1 when the store could be read for this scrape")
        try:
            families = list(self._read())
        except GpuaasError as e:
            log.warning("metrics: %s: %s", e.code, e.message)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self) -> Iterator[Metric]:
        with self._pool.reading() as conn:
            by_result, buckets, total = reads.reconciliation_counts(conn)
            health = history.health(conn)
            summary = reads.fleet_summary(conn)
            cycle = lifecycle.summary(conn)
            leased = leases.summary(conn)
            ports = endpoints.used_ports(conn)
            now = conn.execute("SELECT now()").fetchone()
            guests = list(telemetries.families(conn))  # guest GPU telemetry, by allocation label
            labelled = fleetgauges.read(conn)  # per node and region x SKU: what alerts need
            per_node = fleetgauges.gpus_per_node(conn)
            answer = self._capacity.peek(conn)
        runs = CounterMetricFamily("gpuaas_reconciliations", "Reconciliations finished, by result", labels=["result"])
        for result in ("changed", "unchanged", "error", "abandoned"):
            runs.add_metric([result], by_result.get(result, 0))
        yield runs
        yield GaugeMetricFamily(
            "gpuaas_reconciliations_running", "Reconciliations in progress now", value=by_result.get("running", 0)
        )
        yield HistogramMetricFamily(
            "gpuaas_reconcile_duration_seconds",
            "Duration of finished reconciliations",
            buckets=[(str(b) if b != float("inf") else "+Inf", n) for b, n in buckets],
            sum_value=total,
        )
        if health.last_applied_at is not None and now is not None:
            age = (now[0] - health.last_applied_at).total_seconds()
            yield GaugeMetricFamily(
                "gpuaas_last_applied_age_seconds",
                "Seconds since the newest successful reconciliation finished",
                value=age,
            )
        yield GaugeMetricFamily(
            "gpuaas_reconciliation_failing",
            "1 while reconciliations fail after the newest success",
            value=int(health.failing),
        )
        yield GaugeMetricFamily(
            "gpuaas_reconciliation_failures", "Failed reconciliations since the newest success", value=health.failures
        )
        yield from _head_families(health, now[0] if now else None)
        yield _gauge(
            "gpuaas_allocations",
            "Allocations by state",
            ["state"],
            {(k,): v for k, v in summary["allocations"].items()},
        )
        yield _gauge(
            "gpuaas_allocations_pending",
            "Pending allocations by reason code",
            ["reason"],
            {(k,): v for k, v in summary["pending_by_reason"].items()},
        )
        yield _gauge(
            "gpuaas_slots",
            "Slots of present nodes by state (blocked: cleanup failed)",
            ["state"],
            {(k,): v for k, v in summary["slots"].items()},
        )
        yield GaugeMetricFamily(
            "gpuaas_slots_cleanup_blocked",
            "Slots whose wipe failed, out of sale until repaired",
            value=summary["slots"].get("blocked", 0),
        )
        yield _gauge(
            "gpuaas_nodes",
            "Present nodes by admin state",
            ["admin_state"],
            {(k,): v for k, v in summary["nodes"].items()},
        )
        yield _gauge(
            "gpuaas_drift_findings",
            "Drift findings the hosts reported, by code",
            ["code"],
            {(k,): v for k, v in summary["drift_by_code"].items()},
        )
        yield GaugeMetricFamily(
            "gpuaas_drift_reports_invalid",
            "Host drift reports that could not be read",
            value=len(summary["invalid_drift_reports"]),
        )
        yield _gauge(
            "gpuaas_nodes_liveness",
            "Present nodes by host liveness (unavailable: silent past the TTL; unknown: never reported)",
            ["state"],
            {(k,): cycle["nodes_by_liveness"].get(k, 0) for k in ("live", "unavailable", "disrupted", "unknown")},
        )
        yield _gauge(
            "gpuaas_region_disrupted",
            "1 while a region is disrupted: most of its hosts went silent together,"
            " so none of them is marked unavailable (the zone-disruption rule)",
            ["region"],
            {(r["region"],): int(r["disrupted"]) for r in cycle.get("regions", ())},
        )
        yield GaugeMetricFamily(
            "gpuaas_allocations_host_unreachable",
            "Placed allocations whose host is silent past the TTL (never released for it)",
            value=cycle["allocations_host_unreachable"],
        )
        yield GaugeMetricFamily(
            "gpuaas_slots_quarantined",
            "Slots quarantined after a permanent provision failure",
            value=cycle["slots_quarantined"],
        )
        attempts = CounterMetricFamily(
            "gpuaas_provision_attempts_failed", "Failed provision attempts, by what followed", labels=["outcome"]
        )
        for outcome in ("rescheduled", "failed"):
            attempts.add_metric([outcome], cycle["failed_attempts"].get(outcome, 0))
        yield attempts
        yield _gauge(
            "gpuaas_ingress_ports_used",
            "Public ingress ports held by live endpoints, per node",
            ["node"],
            {(n,): used for n, (used, _) in ports.items()},
        )
        yield _gauge(
            "gpuaas_ingress_ports",
            "Public ingress ports a node declares (its range)",
            ["node"],
            {(n,): size for n, (_, size) in ports.items()},
        )
        yield _gauge(
            "gpuaas_baremetal_leases",
            "Baremetal leases through a machine provider, by phase",
            ["phase"],
            {
                (k,): leased["phases"].get(k, 0)
                for k in (
                    "deploy_requested",
                    "deploying",
                    "active",
                    "deploy_failed",
                    "release_requested",
                    "erasing",
                    "erased",
                    "erase_failed",
                )
            },
        )
        yield _gauge(
            "gpuaas_baremetal_leases_waiting",
            "Unfinished leases waiting, by reason code",
            ["code"],
            {(k,): v for k, v in leased["waiting"].items()},
        )
        yield GaugeMetricFamily(
            "gpuaas_machines_quarantined",
            "Machines quarantined after a failed provider deploy",
            value=leased["quarantined"]["machines"],
        )
        yield _gauge(
            "gpuaas_machine_drift",
            "Provider machines that disagree with our leases, by code",
            ["code"],
            {(k,): v for k, v in leased["drift"].items()},
        )
        yield from guests
        yield from labelled
        if answer is not None:
            yield from _capacity_families(answer)
            yield from fleetgauges.capacity(answer.computed.doc, per_node)


def _capacity_families(answer: statuscache.Answer) -> Iterator[Metric]:
    launchable = GaugeMetricFamily(
        "gpuaas_capacity_launchable",
        "More requests of exactly this size that would be placed now",
        labels=["region", "sku", "gpu_count"],
    )
    for offer in answer.computed.doc["capacity"]:
        for size in offer["sizes"]:
            launchable.add_metric([offer["region"], offer["sku"], str(size["gpu_count"])], size["launchable"])
    yield launchable
    age = (dt.datetime.now(dt.UTC) - answer.computed.as_of).total_seconds()
    yield GaugeMetricFamily("gpuaas_capacity_age_seconds", "Age of the capacity numbers above", value=age)


def _head_families(health: history.Health, now: dt.datetime | None) -> Iterator[Metric]:
    """Is the newest revision the loop saw (HEAD) applied, and since when not? Absent: no history yet."""
    head = health.head
    if head is None:
        return
    yield GaugeMetricFamily(
        "gpuaas_head_applied",
        "1 when the newest revision recorded (HEAD) is the one applied;"
        " 0 while it is refused (invalid, behind) or failing",
        value=int(head.applied),
    )
    since = 0.0
    if not head.applied and head.since is not None and now is not None:
        since = max(0.0, (now - head.since).total_seconds())
    yield GaugeMetricFamily(
        "gpuaas_head_unapplied_seconds", "Seconds HEAD has not been applied (0 while it is)", value=since
    )
    yield GaugeMetricFamily(
        "gpuaas_head_unapplied_since_seconds",
        "Unix time since when HEAD is not applied (0 while it is)",
        value=head.since.timestamp() if not head.applied and head.since is not None else 0.0,
    )


def registry(pool: Pool, capacity: statuscache.Cache) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(pool, capacity))
    ProcessCollector(registry=reg)  # process_cpu_seconds_total, process_resident_memory_bytes, open fds...
    return reg
