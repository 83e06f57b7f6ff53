"""/metrics parsed as Prometheus does, and GPU-hours for billing (`gpuaas usage`, /api/v1/usage)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler import cli
from reconciler.store import connections
from tests.service.conftest import Served, serve

T0 = dt.datetime(2026, 11, 1, 8, 0, tzinfo=dt.UTC)


def _samples(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _by(samples: Mapping[tuple[tuple[str, str], ...], float], label: str) -> dict[str, float]:
    return {dict(k)[label]: v for k, v in samples.items()}


def test_metrics_read_the_store(served: Served, fleet_url: str) -> None:
    status, headers, body = served.get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    m = _samples(body.decode())
    assert m["gpuaas_database_up"][()] == 1
    with connections.connect(fleet_url, autocommit=True) as conn:
        allocs = {
            str(s): float(n)
            for s, n in conn.execute("SELECT status, count(*) FROM allocations GROUP BY status").fetchall()
        }
        pending = {
            str(c): float(n)
            for c, n in conn.execute(
                "SELECT pending_code, count(*) FROM allocations WHERE status = 'pending' AND present GROUP BY 1"
            )
        }
        slots = conn.execute(
            "SELECT count(*) FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id WHERE s.present AND n.present"
        ).fetchone()
    assert _by(m["gpuaas_allocations"], "state") == allocs
    assert _by(m["gpuaas_allocations_pending"], "reason") == pending and pending
    assert slots is not None and sum(m["gpuaas_slots"].values()) == slots[0]
    assert _by(m["gpuaas_reconciliations_total"], "result")["changed"] == 1
    assert m["gpuaas_reconcile_duration_seconds_count"][()] == 1
    assert 0 <= m["gpuaas_last_applied_age_seconds"][()] < 600
    assert m["gpuaas_reconciliation_failing"][()] == 0
    assert _by(m["gpuaas_drift_findings"], "code") == {"drift.disk.signature_present": 1, "drift.network.problem": 1}
    assert m["gpuaas_drift_reports_invalid"][()] == 2
    assert m["gpuaas_slots_cleanup_blocked"][()] == 0
    capacity = served.json("/api/v1/capacity")["capacity"]  # computed now; the next scrape exports it
    m = _samples(served.get("/metrics")[2].decode())
    launchable = {
        (dict(k)["region"], dict(k)["sku"], int(dict(k)["gpu_count"])): v
        for k, v in m["gpuaas_capacity_launchable"].items()
    }
    assert launchable == {
        (o["region"], o["sku"], s["gpu_count"]): s["launchable"] for o in capacity for s in o["sizes"]
    }
    assert any(launchable.values())


def test_metrics_say_the_database_is_down(tmp_path: Path) -> None:
    for s in serve(f"postgresql://postgres@/nothing?host={tmp_path}&port=5432"):
        status, _, body = s.get("/metrics")
        m = _samples(body.decode())
        assert status == 200 and m["gpuaas_database_up"][()] == 0
        assert len(m["gpuaas_build_info"]) == 1 and "gpuaas_node_live" not in m


def test_a_scrape_reads_the_store_in_one_transaction(served: Served) -> None:
    """The fleet totals, the labelled gauges and capacity's snapshot key share one read: one consistent
    snapshot, and with the database down one wait for a connection, not one per collector."""
    pool = served.httpd.service.pool
    readers: list[str] = []
    reading = pool.reading

    def counted(**kw: Any) -> Any:
        readers.append(threading.current_thread().name)
        return reading(**kw)

    served.json("/api/v1/capacity")  # computed now, so the scrape exports it
    pool.reading = counted  # type: ignore[method-assign]
    try:
        m = _samples(served.get("/metrics")[2].decode())
    finally:
        del pool.reading
    assert m["gpuaas_database_up"][()] == 1 and m["gpuaas_node_live"] and m["gpuaas_sku_units"]
    assert m["gpuaas_capacity_launchable"]
    assert len([r for r in readers if r != "gpuaas-capacity"]) == 1  # before: four (two collectors, two peeks)


def _run_claims(url: str) -> dict[str, int]:
    """alloc-0002 (2 GPUs) active T0..T0+10h and released; alloc-0001 (1 GPU) active from T0+4h, still running."""
    with connections.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE allocation_resource_claims SET status = 'active', active_at = %s"
            " WHERE allocation_id = 'alloc-0002'",
            (T0,),
        )
        conn.execute(
            "UPDATE allocation_resource_claims SET status = 'releasing', release_requested_at = %s"
            " WHERE allocation_id = 'alloc-0002'",
            (T0 + dt.timedelta(hours=10),),
        )
        conn.execute(
            "UPDATE allocation_resource_claims SET status = 'active', active_at = %s"
            " WHERE allocation_id = 'alloc-0001'",
            (T0 + dt.timedelta(hours=4),),
        )
        prices = conn.execute(
            "SELECT allocation_id, max((resource_snapshot -> 'price' ->> 'gpu_hourly_price_minor')"
            "::int) FROM allocation_resource_claims WHERE allocation_id IN ('alloc-0001',"
            " 'alloc-0002') GROUP BY 1"
        ).fetchall()
    return {str(a): int(p) for a, p in prices}


def test_usage_is_prorated_to_the_window(fleet_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    price = _run_claims(fleet_url)
    window = ["--from", (T0 + dt.timedelta(hours=2)).isoformat(), "--to", (T0 + dt.timedelta(hours=5)).isoformat()]
    capsys.readouterr()
    assert cli.main(["usage", *window, "-o", "json", "--db-url", fleet_url]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {a["allocation_id"]: a for a in doc["allocations"]}
    assert set(rows) == {"alloc-0001", "alloc-0002"}
    assert rows["alloc-0002"]["gpu_hours"] == pytest.approx(2 * 3.0)  # 2 GPUs x (T0+2h .. T0+5h)
    assert rows["alloc-0001"]["gpu_hours"] == pytest.approx(1 * 1.0)  # 1 GPU x (T0+4h .. T0+5h)
    assert rows["alloc-0002"]["amount_minor"] == 6 * price["alloc-0002"]
    assert rows["alloc-0001"]["amount_minor"] == 1 * price["alloc-0001"]
    tenants = {t["tenant"]: t for t in doc["tenants"]}
    assert tenants[rows["alloc-0002"]["tenant"]]["gpu_hours"] == pytest.approx(6.0)
    assert cli.main(["usage", *window, "--tenant", "globex", "-o", "csv", "--db-url", fleet_url]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["allocation_id"], float(r["gpu_hours"])) for r in table] == [("alloc-0002", 6.0)]
    assert cli.main(["usage", "--from", "2026-10-01", "--to", "2026-10-31", "--db-url", fleet_url]) == 0
    assert "(no usage in this window)" in capsys.readouterr().out
    assert cli.main(["usage", "--from", "soon", "--db-url", fleet_url]) == 1
    assert "error: usage.bad_time:" in capsys.readouterr().err


def test_usage_api_matches_the_command(served: Served, fleet_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _run_claims(fleet_url)
    capsys.readouterr()
    assert cli.main(["usage", "--from", "2026-11-01", "--to", "2026-11-02", "-o", "json", "--db-url", fleet_url]) == 0
    assert served.json("/api/v1/usage?from=2026-11-01&to=2026-11-02") == json.loads(capsys.readouterr().out)
