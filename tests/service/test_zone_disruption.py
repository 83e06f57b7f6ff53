"""Mass silence is not mass death: the zone-disruption rule (migration 0061) on a real PostgreSQL.

region us-east-1: node-0 .. node-5, all reported
silence 2 of 6    -> those two are `unavailable` (ordinary silence)
silence 5 of 6    -> the region is disrupted: the five are `disrupted`, not
                     unavailable; status, the dashboard and /metrics say so
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import schemas
from host_reconciler import hostdb
from reconciler.store import lifecycle
from tests.host.test_hostdb import add_node
from tests.service.conftest import serve

NODES = [f"node-{i}" for i in range(6)]


def silence(url: str, nodes: list[str]) -> None:
    with hostdb.connect(url) as conn:
        conn.execute("UPDATE host_status SET reported_at = now() WHERE true")
        conn.execute(
            "UPDATE host_status SET reported_at = now() - interval '1 hour' WHERE node_name = ANY(%s)", (nodes,)
        )


@pytest.fixture
def region_url(db_url: str) -> str:
    with hostdb.connect(db_url) as conn:
        for node in NODES:
            add_node(conn, node)
            hostdb.heartbeat(conn, node)
    return db_url


def test_a_few_silent_nodes_are_unavailable_most_of_a_region_is_disrupted(region_url: str) -> None:
    silence(region_url, NODES[:2])
    with hostdb.connect(region_url) as conn:
        live = {n: v.liveness for n, v in lifecycle.liveness(conn).items()}
        assert [live[n] for n in NODES] == ["unavailable"] * 2 + ["live"] * 4
        assert lifecycle.silent_nodes(conn) == frozenset(NODES[:2])
    silence(region_url, NODES[:5])
    with hostdb.connect(region_url) as conn:
        live = {n: v.liveness for n, v in lifecycle.liveness(conn).items()}
        assert [live[n] for n in NODES] == ["disrupted"] * 5 + ["live"]
        assert lifecycle.silent_nodes(conn) == frozenset()  # nothing is marked, the planner avoids nothing
        assert lifecycle.disruption(conn) == [{"region": "us-east-1", "nodes": 6, "silent": 5, "disrupted": True}]


def test_silent_nodes_match_the_view_below_and_above_the_fraction(region_url: str) -> None:
    """`silent_nodes` reads from the silent reports out, not through `node_liveness`: same answer.
    Three of six silent is more than two but not over the fraction (0.55): still ordinary silence."""
    for silent in (NODES[:3], NODES[:4], []):
        silence(region_url, silent)
        with hostdb.connect(region_url) as conn:
            view = conn.execute("SELECT node_name FROM node_liveness WHERE liveness = 'unavailable'").fetchall()
            assert lifecycle.silent_nodes(conn) == frozenset(str(r[0]) for r in view)
            assert lifecycle.silent_nodes(conn) == (frozenset(silent) if len(silent) == 3 else frozenset())


def test_disruption_is_shown_in_metrics_and_dashboard(region_url: str) -> None:
    silence(region_url, NODES[:5])
    for s in serve(region_url):
        text = s.get("/metrics")[2].decode()
        samples = {
            (m.name, tuple(sorted(x.labels.items()))): x.value
            for m in text_string_to_metric_families(text)
            for x in m.samples
        }
        assert samples[("gpuaas_region_disrupted", (("region", "us-east-1"),))] == 1
        assert samples[("gpuaas_nodes_liveness", (("state", "disrupted"),))] == 5
        assert samples[("gpuaas_nodes_liveness", (("state", "unavailable"),))] == 0
        page = s.get("/")[2].decode()
        assert 'id="disrupted-us-east-1"' in page and "5 of 6 hosts" in page


def test_status_names_the_disrupted_region(region_url: str) -> None:
    silence(region_url, NODES[:5])
    from reconciler.commands import status

    doc = status.collect(region_url)
    assert doc["disrupted_regions"] == [{"region": "us-east-1", "nodes": 6, "silent": 5, "disrupted": True}]
    assert "DISRUPTED" in status.render_text(doc)
    assert json.loads(json.dumps(doc, default=str))["disrupted_regions"][0]["silent"] == 5


def _liveness_0061() -> str:
    """Migration 0061's node_liveness query, read from the migration: the reference 0089 must answer as."""
    text = (Path(schemas.__file__).parent / "sql" / "0061_zone_disruption.sql").read_text()
    head = "CREATE OR REPLACE VIEW node_liveness AS"
    body = text[text.index(head) + len(head) :]
    return body[: body.index(";")]


def test_the_view_gives_what_0061_gave(region_url: str) -> None:
    """Two more regions (one with a host that never reported, one node no longer present), then silence
    patterns below, at and above the fraction in each, with and without fleet settings: row for row the same."""
    rng = random.Random(7)  # noqa: S311 - which nodes go silent, not security
    names = list(NODES)
    with hostdb.connect(region_url) as conn:
        for region, count in (("eu-west-1", 5), ("ap-south-1", 4)):
            for i in range(count):
                name = f"{region}-{i}"
                add_node(conn, name)
                conn.execute("UPDATE nodes SET region = %s WHERE name = %s", (region, name))
                if i:  # the first never reports: unknown, and not counted as reported
                    hostdb.heartbeat(conn, name)
                names.append(name)
        conn.execute("UPDATE nodes SET present = false WHERE name = 'eu-west-1-4'")
    settings = (None, (60, 0.5), (3600, 0.9))
    for step in range(12):
        silent = rng.sample(names, rng.randrange(len(names) + 1))
        silence(region_url, silent)
        with hostdb.connect(region_url) as conn:
            conn.execute("DELETE FROM fleet_settings")
            ttl = settings[step % 3]
            if ttl is not None:
                conn.execute(
                    "INSERT INTO fleet_settings (name, management_network, placement, graceful_shutdown_timeout_s,"
                    " readiness_timeout_s, host_liveness_ttl_s, zone_disruption_fraction)"
                    " VALUES ('fleet', '{}', '{}', 120, 300, %s, %s)",
                    ttl,
                )
            with conn.transaction():  # one now() for both: silent_s is rounded to 0.1 s
                now = conn.execute("SELECT * FROM node_liveness ORDER BY node_name").fetchall()
                before = conn.execute(_liveness_0061() + " ORDER BY node_name").fetchall()
            assert now == before, (step, sorted(silent), ttl)
            assert {r[4] for r in now} <= {"live", "unavailable", "disrupted", "unknown"}


def test_one_node_is_answered_without_counting_the_fleet(region_url: str) -> None:
    """A lookup by node (what allocation_lifecycle does for GET /api/v1/allocations/{id}) reads that node by
    its index and, for a live host, never counts the regions; a silent one counts them once."""
    with hostdb.connect(region_url) as conn:
        conn.execute(
            "INSERT INTO nodes (name, region, pool, admin_state, storage_mode, os_disk, capability, management_network)"
            " SELECT 'bulk-' || i, 'us-east-1', 'h200-slice', 'active', 'slice', '/dev/disk/by-id/nvme-OS',"
            " 'both_capable', '{}'::jsonb FROM generate_series(1, 5000) i"
        )
        conn.execute("ANALYZE nodes")
        conn.execute("ANALYZE host_status")
    silence(region_url, NODES[:1])

    def plan(node: str) -> dict[str, Any]:
        with hostdb.connect(region_url) as conn:
            row = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT liveness FROM node_liveness WHERE node_name = %s", (node,)
            ).fetchone()
        assert row is not None
        return dict(row[0][0]["Plan"])

    def walk(p: dict[str, Any]) -> list[dict[str, Any]]:
        return [p, *(q for child in p.get("Plans", []) for q in walk(child))]

    for node, counted in (("node-5", 0), ("node-0", 1)):
        steps = walk(plan(node))
        assert not [s for s in steps if s["Node Type"] == "Seq Scan" and s.get("Relation Name") == "nodes"], node
        # the init plan that asks for the disrupted regions ran once for the silent node, never for the live one
        inits = [s for s in steps if s.get("Parent Relationship") == "InitPlan" and s["Node Type"] == "Result"]
        ran = [s["Actual Loops"] for s in inits]
        assert sum(ran) == counted, (node, ran)
