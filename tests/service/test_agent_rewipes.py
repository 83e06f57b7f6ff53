"""Guest telemetry and slot rewipe requests through the agent API (migration 0062), real PostgreSQL and serve.

    node-a, node-b   two nodes with plans and tokens; one rewipe request each

Before 0062 a status report carrying telemetry was refused whole by the
database (gpuaas_agent had no grant on allocation_telemetry: 400
agent.report_invalid, nothing written) and an agent behind the service never
saw its rewipe requests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.service.conftest import Served, serve
from tests.service.test_agent_api import client, issue, nodes_url, status_doc

__all__ = ["nodes_url"]  # the fixture, shared

SAMPLE = {"gpus": [{"index": 0, "utilization_pct": 71.0, "memory_used_mib": 1024, "temperature_c": None}]}


@pytest.fixture
def served(nodes_url: str) -> Iterator[Served]:
    yield from serve(nodes_url)


def _request(url: str, node: str, slot: int) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO slot_rewipe_requests (node_name, slot_index, requested_by, reason)"
            " VALUES (%s, %s, 'ops', 'test') RETURNING id",
            (node, slot),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_status_report_with_telemetry_lands_in_allocation_telemetry(served: Served, nodes_url: str) -> None:
    doc = status_doc("node-a", 1)
    received = time.time()
    doc["telemetry"] = {"alloc-node-a": {**SAMPLE, "received_at": received}}
    with client(served, issue(nodes_url, "node-a")) as c:
        r = c.post("/api/v1/agent/nodes/node-a/reports/status", json=doc)
        assert r.status_code == 200, r.text
        assert r.json()["written"] is True
        # a report naming another node's telemetry cannot place rows there: the report names its node only
    with psycopg.connect(nodes_url) as conn:
        rows = conn.execute(
            "SELECT allocation_id, node_name, sample, extract(epoch FROM received_at) FROM allocation_telemetry"
        ).fetchall()
    assert [(a, n, s) for a, n, s, _ in rows] == [("alloc-node-a", "node-a", SAMPLE)]
    assert abs(float(rows[0][3]) - received) < 1.0


def test_a_node_reads_and_answers_only_its_own_rewipe_requests(served: Served, nodes_url: str) -> None:
    mine, theirs = _request(nodes_url, "node-a", 0), _request(nodes_url, "node-b", 1)
    with client(served, issue(nodes_url, "node-a")) as a:
        r = a.get("/api/v1/agent/nodes/node-a/rewipes")
        assert r.status_code == 200, r.text
        assert r.json() == {"node": "node-a", "requests": [{"id": mine, "slot_index": 0}]}
        # another node's path: the token is refused; another node's request id on its own path: not found
        assert a.get("/api/v1/agent/nodes/node-b/rewipes").status_code == 403
        r = a.post(f"/api/v1/agent/nodes/node-b/rewipes/{theirs}", json={"state": "accepted"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "agent.forbidden"
        r = a.post(f"/api/v1/agent/nodes/node-a/rewipes/{theirs}", json={"state": "accepted"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "agent.rewipe_not_found", r.text
        r = a.post(f"/api/v1/agent/nodes/node-a/rewipes/{mine}", json={"state": "maybe"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "agent.report_invalid"
        r = a.post(
            f"/api/v1/agent/nodes/node-a/rewipes/{mine}",
            json={"state": "refused", "answer": {"code": "host.rewipe.not_blocked"}},
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"node": "node-a", "id": mine, "state": "refused"}
        r = a.post(f"/api/v1/agent/nodes/node-a/rewipes/{mine}", json={"state": "accepted"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "agent.rewipe_answered"
        assert a.get("/api/v1/agent/nodes/node-a/rewipes").json()["requests"] == []
    with psycopg.connect(nodes_url) as conn:
        rows = conn.execute(
            "SELECT id, state, answered_at IS NOT NULL, answer FROM slot_rewipe_requests ORDER BY id"
        ).fetchall()
    assert rows == [(mine, "refused", True, {"code": "host.rewipe.not_blocked"}), (theirs, "pending", False, {})]
