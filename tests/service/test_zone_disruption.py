"""Mass silence is not mass death: the zone-disruption rule (migration 0061) on a real PostgreSQL.

region us-east-1: node-0 .. node-5, all reported
silence 2 of 6    -> those two are `unavailable` (ordinary silence)
silence 5 of 6    -> the region is disrupted: the five are `disrupted`, not
                     unavailable; status, the dashboard and /metrics say so
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

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
