"""The agent API of `gpuaas serve` on a real PostgreSQL, with real HTTP clients.

    node-a, node-b   two nodes with plans (generation 1); each has its own token
    serve            127.0.0.1, an ephemeral port

A token is one node's: it reads that node's plan and writes that node's
reports, nothing else (403, nothing written); the database fences the
node's rows even when the service is bypassed.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from host_reconciler import agentclient, hostdb
from reconciler import cli
from reconciler.service import agenttokens
from reconciler.store import hostplans as central_plans
from schemas import agentwire
from tests.host.test_hostdb import add_node, plan
from tests.service.conftest import Served, serve


@pytest.fixture
def nodes_url(db_url: str) -> str:
    with hostdb.connect(db_url) as conn:
        for node in ("node-a", "node-b"):
            add_node(conn, node)
            central_plans.store(conn, [plan(node, 1)])
    return db_url


def issue(url: str, node: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        return agenttokens.issue_token(conn, node, rotate=False)


@pytest.fixture
def served(nodes_url: str) -> Iterator[Served]:
    yield from serve(nodes_url)


def client(s: Served, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=s.url, headers=headers, timeout=60)


def status_doc(node: str, observed: int) -> dict[str, Any]:
    return {
        "node": node,
        "generation": observed,
        "observed_generation": observed,
        "mode": "report",
        "converged": True,
        "healthy": True,
        "reported_at": "2026-11-27T10:00:00+00:00",
        "pass_ms": 1.0,
        "slots": [
            {
                "slot_index": 0,
                "state": "active",
                "allocation_id": f"alloc-{node}",
                "vm_state": "ready",
                "vm_ready_at": None,
                "phase": None,
                "wipe_allocation_id": None,
                "wipe_state": None,
                "wipe_evidence": {},
                "wipe_error": None,
                "phase_timings": {},
                "drift": [],
                "schedulable": True,
            }
        ],
        "vms": [],
        "drift": [],
        "errors": [],
        "pending": [],
        "images": {"cached": []},
    }


def stored(url: str, node: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT observed_generation FROM host_status WHERE node_name = %s", (node,)).fetchone()
    return None if row is None else row[0]


def test_a_token_reads_and_writes_only_its_own_node(served: Served, nodes_url: str) -> None:
    a = issue(nodes_url, "node-a")
    with client(served, a) as http:
        got = http.get(agentwire.plan_path("node-a"))
        assert got.status_code == 200 and got.json()["generation"] == 1 and got.json()["plan"]["node"] == "node-a"
        other = http.get(agentwire.plan_path("node-b"))
        assert other.status_code == 403 and other.json()["error"]["code"] == agentwire.FORBIDDEN
        assert "vms" not in other.text
        wrote = http.post(agentwire.report_path("node-b", "status"), json=status_doc("node-b", 1))
        assert wrote.status_code == 403 and wrote.json()["error"]["code"] == agentwire.FORBIDDEN
        beat = http.post(agentwire.heartbeat_path("node-b"))
        assert beat.status_code == 403
        # a report for node-a that names node-b in its body is refused as well
        smuggled = http.post(agentwire.report_path("node-a", "status"), json=status_doc("node-b", 1))
        assert smuggled.status_code == 400 and smuggled.json()["error"]["code"] == agentwire.REPORT_INVALID
        lost = http.get(agentwire.PREFIX + "/nodes/node-a/nothing-here")
        assert lost.status_code == 404 and lost.json()["error"]["code"] == "api.route_not_found"
        wrong = http.delete(agentwire.plan_path("node-a"))
        assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "api.method_not_allowed"
    time.sleep(1.5)  # past a heartbeat flush
    assert stored(nodes_url, "node-b") is None  # nothing written for node-b
    for token in (None, agentwire.TOKEN_PREFIX + "not-a-real-one"):
        with client(served, token) as http:
            refused = http.get(agentwire.plan_path("node-a"))
            assert refused.status_code == 401 and refused.json()["error"]["code"] == agentwire.UNAUTHORIZED


def test_a_stale_status_report_is_ignored(served: Served, nodes_url: str) -> None:
    a = issue(nodes_url, "node-a")
    with client(served, a) as http:
        first = http.post(agentwire.report_path("node-a", "status"), json=status_doc("node-a", 2))
        assert first.status_code == 200 and first.json()["written"] is True, first.text
        late = http.post(agentwire.report_path("node-a", "status"), json=status_doc("node-a", 1))
        assert late.status_code == 200 and late.json()["written"] is False
        bad = http.post(agentwire.report_path("node-a", "status"), json={"node": "node-a", "slots": "x"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == agentwire.REPORT_INVALID
    assert stored(nodes_url, "node-a") == 2


def test_heartbeats_are_batched_into_reported_at(served: Served, nodes_url: str) -> None:
    a = issue(nodes_url, "node-a")
    with client(served, a) as http:
        assert http.post(agentwire.heartbeat_path("node-a")).json() == {"node": "node-a", "accepted": True}
    deadline = time.monotonic() + 30
    while stored(nodes_url, "node-a") is None:
        assert time.monotonic() < deadline, "the heartbeat never reached host_status"
        time.sleep(0.1)
    from prometheus_client.parser import text_string_to_metric_families

    samples = {
        x.name: x.value for m in text_string_to_metric_families(served.get("/metrics")[2].decode()) for x in m.samples
    }
    assert samples["gpuaas_agent_heartbeats_total"] == 1 and samples["gpuaas_agent_heartbeat_batches_total"] >= 1


def test_a_watch_returns_when_the_plan_changes(served: Served, nodes_url: str) -> None:
    a = issue(nodes_url, "node-a")
    source = agentclient.AgentClient(served.url, "node-a", a)
    try:
        idle = source.plan(after=1, wait_s=0.3)
        assert idle.changed is False and idle.generation == 1 and idle.plan is None
        answers: list[agentwire.PlanAnswer] = []
        watch = threading.Thread(target=lambda: answers.append(source.plan(after=1, wait_s=40)))
        watch.start()
        time.sleep(0.5)  # the watch is waiting (no change yet)
        assert not answers
        with hostdb.connect(nodes_url) as conn:
            central_plans.store(conn, [plan("node-b", 2)])  # another node's change wakes nobody here
            time.sleep(0.3)
            assert not answers
            central_plans.store(conn, [plan("node-a", 2)])
        watch.join(timeout=30)
        assert answers and answers[0].changed and answers[0].generation == 2 and answers[0].plan is not None
    finally:
        source.close()


def test_token_commands_issue_rotate_revoke(
    served: Served, nodes_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "node-a.token"
    assert cli.main(["host", "token", "issue", "node-a", "--out", str(out), "--db-url", nodes_url]) == 0
    assert out.stat().st_mode & 0o077 == 0
    old = agentclient.load_credential(out)
    assert cli.main(["host", "token", "issue", "node-a", "--db-url", nodes_url]) == 1
    assert "host.token.exists" in capsys.readouterr().err
    with client(served, old) as http:
        assert http.get(agentwire.plan_path("node-a")).status_code == 200  # cached now
    assert cli.main(["host", "token", "rotate", "node-a", "-o", "json", "--db-url", nodes_url]) == 0
    new = json.loads(capsys.readouterr().out)["token"]
    with client(served, old) as http:
        deadline = time.monotonic() + 30  # the NOTIFY reaches the service's cache
        while http.get(agentwire.plan_path("node-a")).status_code != 401:
            assert time.monotonic() < deadline, "the rotated token still works"
            time.sleep(0.1)
    with client(served, new) as http:
        assert http.get(agentwire.plan_path("node-a")).status_code == 200
    assert cli.main(["host", "token", "issue", "no-such-node", "--db-url", nodes_url]) == 1
    assert "host.token.no_node" in capsys.readouterr().err


def test_the_database_fences_the_agent_identity_without_the_service(nodes_url: str) -> None:
    with psycopg.connect(nodes_url) as conn:  # the service's login, doing what a bug in the service might
        conn.execute("SET ROLE gpuaas_agent")
        conn.execute("SELECT set_config('gpuaas.agent_node', 'node-a', false)")
        seen = conn.execute("SELECT node_name FROM host_plans ORDER BY 1").fetchall()
        assert seen == [("node-a",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO host_status (node_name) VALUES ('node-b')")
        conn.rollback()
        conn.execute("SET ROLE gpuaas_agent")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # credentials are the owner's only
            conn.execute("SELECT * FROM node_agent_tokens")
    with hostdb.connect(nodes_url) as conn:
        creds = hostdb.create_node_role(conn, "node-a", "pw-a")
    with hostdb.connect(nodes_url, role=creds.role, password=creds.password, autocommit=False) as conn:
        # a node's own login cannot take the service's agent identity to reach another node's rows
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SET ROLE gpuaas_agent")
        conn.rollback()
        conn.execute("SELECT set_config('gpuaas.agent_node', 'node-b', false)")
        assert conn.execute("SELECT node_name FROM host_plans").fetchall() == [("node-a",)]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM node_agent_tokens")


def test_host_allow_list_refuses_rebinding(nodes_url: str) -> None:
    for s in serve(nodes_url, allowed_hosts=("api.gpu.example",)):
        port = s.url.rsplit(":", 1)[1]
        with httpx.Client(base_url=s.url, timeout=30) as http:
            bad = http.get("/api/v1/nodes", headers={"Host": "rebind.attacker.example"})
            assert bad.status_code == 421 and bad.json()["error"]["code"] == "serve.host_not_allowed"
            assert "node-a" not in bad.text
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", "API.gpu.example", f"[::1]:{port}"):
                assert http.get("/api/v1/nodes", headers={"Host": host}).status_code == 200, host
            assert http.get("/healthz", headers={"Host": "probe.example"}).status_code == 200


def test_a_slow_client_is_cut(nodes_url: str) -> None:
    for s in serve(nodes_url, header_timeout_s=0.5, request_timeout_s=1.0):
        host, port = s.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            deadline = time.monotonic() + 20
            closed = False
            while time.monotonic() < deadline and not closed:
                try:
                    sock.sendall(b"X-Drip: 1\r\n")  # a line every 0.5 s: never a whole head (nor 100 headers)
                    sock.settimeout(0.5)
                    closed = sock.recv(1) == b""
                except TimeoutError:
                    continue
                except OSError:
                    closed = True
            assert closed, "a client dripping its request head was never cut"
        a = issue(nodes_url, "node-a")
        with client(s, a) as http:  # a request that outlives --request-timeout gets 503 and a stable code
            slow = http.get(agentwire.plan_path("node-a"), params={"after": 1, "wait": 10})
            assert slow.status_code == 503 and slow.json()["error"]["code"] == "serve.request_timeout"


def test_connections_past_the_cap_get_503(nodes_url: str) -> None:
    for s in serve(nodes_url, max_connections=4):
        host, port = s.url.removeprefix("http://").rsplit(":", 1)
        held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(6)]
        try:
            time.sleep(0.3)
            with httpx.Client(base_url=s.url, timeout=30) as http:
                assert http.get("/healthz").status_code == 503
        finally:
            for sock in held:
                sock.close()


def test_two_replicas_need_nothing_from_each_other(nodes_url: str) -> None:
    a = issue(nodes_url, "node-a")
    for one in serve(nodes_url):
        for two in serve(nodes_url):
            with client(one, a) as http:  # the report goes to one replica ...
                assert (
                    http.post(agentwire.report_path("node-a", "status"), json=status_doc("node-a", 3)).json()["written"]
                    is True
                )
            with client(two, a) as http:  # ... a stale retry to the other is still refused by the stored state
                assert (
                    http.post(agentwire.report_path("node-a", "status"), json=status_doc("node-a", 2)).json()["written"]
                    is False
                )
            answers: list[agentwire.PlanAnswer] = []
            watcher = agentclient.AgentClient(two.url, "node-a", a)
            watch = threading.Thread(target=lambda w=watcher, out=answers: out.append(w.plan(after=1, wait_s=40)))
            watch.start()
            time.sleep(0.3)
            with hostdb.connect(nodes_url) as conn:  # the reconciler writes; replica two hears it itself
                central_plans.store(conn, [plan("node-a", 2)])
            watch.join(timeout=30)
            watcher.close()
            assert answers and answers[0].changed and answers[0].generation == 2
            with psycopg.connect(nodes_url, autocommit=True) as conn:
                agenttokens.issue_token(conn, "node-a", rotate=True)
            for replica in (one, two):  # both drop the old token (each heard the NOTIFY)
                with client(replica, a) as http:
                    deadline = time.monotonic() + 30
                    while http.get(agentwire.plan_path("node-a")).status_code != 401:
                        assert time.monotonic() < deadline
                        time.sleep(0.1)
