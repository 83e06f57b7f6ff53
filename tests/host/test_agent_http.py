"""The host agent through the service only: no database URL, a node token, a real `gpuaas serve`.

lab node-a (loop disks, a namespace, libvirt test driver)
  <- plan generation 1 (alloc-1 on slot 0) from serve
  -> status report to serve                       host_slot_status: slot 0 ready
  <- plan generation 2 (+ alloc-2 on slot 1), delivered by the watch, not the interval
  -> status report                                 slot 1 ready, observed generation 2
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psycopg
import pytest

from host_reconciler import agentclient, hostdb
from reconciler import cli
from reconciler.service import agenttokens
from reconciler.store import hostplans as central_plans
from tests.host.conftest import Lab
from tests.host.test_hostdb import add_node, plan
from tests.service.conftest import serve


def slot_rows(url: str, node: str) -> list[tuple[int, str, int]]:
    with psycopg.connect(url) as conn:
        return [
            tuple(r)
            for r in conn.execute(  # type: ignore[misc]
                "SELECT slot_index, vm_state, observed_generation FROM host_slot_status WHERE node_name = %s"
                " ORDER BY slot_index",
                (node,),
            ).fetchall()
        ]


def test_the_lab_host_converges_through_the_api_only(
    lab: Lab, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hostdb.connect(db_url) as conn:
        add_node(conn, lab.node)
        central_plans.store(conn, [lab.plan(1, vms=(lab.vm("alloc-1", (0,)),))])
    credential = tmp_path / "node.token"
    assert cli.main(["host", "token", "issue", lab.node, "--out", str(credential), "--db-url", db_url]) == 0
    monkeypatch.delenv("GPUAAS_DATABASE_URL", raising=False)  # the agent is given no database at all
    for s in serve(db_url):
        codes: list[int] = []
        started = time.monotonic()
        argv = [
            "host",
            "run",
            "--node",
            lab.node,
            "--config",
            str(lab.write_config()),
            "--service",
            s.url,
            "--credential",
            str(credential),
            "--passes",
            "2",
            "--interval",
            "120",
        ]
        agent = threading.Thread(target=lambda argv=argv, codes=codes: codes.append(cli.main(argv)))
        agent.start()
        try:
            deadline = time.monotonic() + 90
            while [r[:2] for r in slot_rows(db_url, lab.node)][:1] != [(0, "ready")]:
                assert time.monotonic() < deadline and agent.is_alive(), slot_rows(db_url, lab.node)
                time.sleep(0.2)
            with hostdb.connect(db_url) as conn:  # a new placement: the watch brings it, not the 120 s interval
                central_plans.store(conn, [lab.plan(2, vms=(lab.vm("alloc-1", (0,)), lab.vm("alloc-2", (1,))))])
        finally:
            agent.join(timeout=100)
        assert codes == [0]
        assert time.monotonic() - started < 100  # well under the interval: the watch woke the agent
        rows = slot_rows(db_url, lab.node)
        assert rows[:2] == [(0, "ready", 2), (1, "ready", 2)], rows


def test_the_agent_keeps_its_plan_and_queues_reports_while_the_service_is_away(db_url: str) -> None:
    with hostdb.connect(db_url) as conn:
        add_node(conn, "node-a")
        central_plans.store(conn, [plan("node-a", 1)])
        token = agenttokens.issue_token(conn, "node-a", rotate=False)
    port = 0
    for s in serve(db_url):
        port = int(s.url.rsplit(":", 1)[1])
        source = agentclient.ServiceSource(s.url, "node-a", token)
        held = source.plan()
        assert held is not None and held.generation == 1
    try:
        # the service is gone: the agent converges to the plan it holds (never to "no plan") and queues reports
        assert source.plan() is held
        report = {
            "node": "node-a",
            "generation": 1,
            "observed_generation": 1,
            "healthy": True,
            "slots": [],
            "vms": [],
            "drift": [],
            "errors": [],
            "images": {"cached": []},
        }
        source.report("status", report)
        assert source.queued == {"status": report}
        stop = threading.Event()
        t0 = time.monotonic()
        source.sleep(1.0, stop)  # backs off (jittered), no exception
        assert time.monotonic() - t0 >= 0.9 and source.backoff.failures >= 1
        for _ in serve(db_url, port=port):  # the service is back on the same address
            assert source.flush() and source.queued == {}
            with psycopg.connect(db_url) as conn:
                row = conn.execute("SELECT observed_generation FROM host_status WHERE node_name = 'node-a'").fetchone()
            assert row == (1,)
    finally:
        source.close()


def test_backoff_is_exponential_with_full_jitter() -> None:
    top = agentclient.Backoff(base=0.5, cap=30.0, rand=lambda: 1.0)
    assert [top.next() for _ in range(8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    low = agentclient.Backoff(rand=lambda: 0.0)
    assert low.next() == 0.0  # full jitter: anywhere from 0, so a fleet does not return in one wave
    top.reset()
    assert top.next() == 1.0


def test_a_credential_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(agenttokens.new_token() + "\n")
    path.chmod(0o644)
    with pytest.raises(Exception, match="group or others") as e:
        agentclient.load_credential(path)
    assert getattr(e.value, "code", "") == "host.credential.permissions"
    path.chmod(0o600)
    assert agentclient.load_credential(path).startswith("gpuaas-node-")
