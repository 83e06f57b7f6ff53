"""`gpuaas slot rewipe NODE SLOT`: an audited request the host agent acts on (issue 35).

    operator ── slot rewipe ──▶ slot_rewipe_requests + outbox ◀── node-a's `host converge` reads, answers
    node-a: a lab host whose released slot was blocked (its disk was mounted when the wipe came)

The operator unmounts the disk, asks for a rewipe; the agent's next pass lifts
the block, wipes, verifies, runs the health step and frees the slot; the
central reconciler then returns it to service. A request for a slot that is
not blocked is refused by the host, and nothing changes there.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from desired import models as m
from reconciler import cli
from reconciler.reconcile import reconciling
from reconciler.store import connections
from tests.host.conftest import Lab
from tests.host.test_reschedule import current_node, desired
from tests.service.conftest import serve


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    capsys.readouterr()
    rc = cli.main(list(argv))
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip().startswith("{") else {}


def test_rewipe_frees_a_blocked_slot_once_its_cause_is_fixed(
    lab: Lab, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = desired(lab, digest=lab.digest)
    config = str(lab.write_config())
    converge = ("host", "converge", "--node", "node-a", "--db-url", db_url, "--config", config, "-o", "json")
    with connections.connect(db_url, autocommit=True) as conn:
        reconciling.reconcile(conn, state)
        node, slots = current_node(conn)
        assert node == "node-a"
        slot = slots[0]
        assert _cli(capsys, *converge)[0] == 0  # provisioned, active
        released = {"state": m.AllocationState.RELEASED}
        state.allocations["alloc-1"] = state.allocations["alloc-1"].model_copy(update=released)
        reconciling.reconcile(conn, state)
        point = lab.loops.mount(lab.slot_disks[slot])  # host storage took the disk: the wipe must refuse
        rc, doc = _cli(capsys, *converge)
        mine = next(s for s in doc["slots"] if s["slot_index"] == slot)  # type: ignore[attr-defined]
        assert rc == 2 and mine["state"] == "cleanup_blocked" and mine["wipe_error"].startswith("host.disk.mounted")

        other = 1 - slot
        rc, asked = _cli(
            capsys,
            "slot",
            "rewipe",
            "node-a",
            str(other),
            "--reason",
            "wrong slot",
            "--by",
            "ops",
            "--db-url",
            db_url,
            "-o",
            "json",
        )
        assert rc == 0 and asked["outcome"] == "requested"
        subprocess.run(["umount", str(point)], check=True)
        rc, asked = _cli(
            capsys,
            "slot",
            "rewipe",
            "node-a",
            str(slot),
            "--reason",
            "disk unmounted",
            "--by",
            "ops",
            "--db-url",
            db_url,
            "-o",
            "json",
        )
        assert rc == 0 and asked["outcome"] == "requested"
        again = _cli(capsys, "slot", "rewipe", "node-a", str(slot), "--db-url", db_url, "-o", "json")[1]
        assert again["outcome"] == "already_pending" and again["request_id"] == asked["request_id"]
        event = conn.execute(
            "SELECT payload FROM outbox WHERE event_type = 'slot.rewipe_requested' AND aggregate_id = %s",
            (f"node-a:{slot}",),
        ).fetchone()
        assert event is not None and event[0]["requested_by"] == "ops" and event[0]["reason"] == "disk unmounted"

        rc, doc = _cli(capsys, *converge)  # the agent answers, then wipes, verifies, checks health, frees
        mine = next(s for s in doc["slots"] if s["slot_index"] == slot)  # type: ignore[attr-defined]
        assert rc == 0 and mine["state"] == "available" and mine["wipe_state"] == "verified", mine
        assert mine["wipe_evidence"]["health"]["ok"] is True
        assert mine["wipe_evidence"]["signature_clear"] is True  # a fresh wipe, not the blocked attempt's
        answers = dict(conn.execute("SELECT slot_index, state FROM slot_rewipe_requests").fetchall())
        assert answers == {slot: "accepted", other: "refused"}
        refusal = conn.execute("SELECT answer FROM slot_rewipe_requests WHERE slot_index = %s", (other,)).fetchone()
        assert refusal is not None and refusal[0]["code"] == "host.rewipe.not_blocked"
        reconciling.reconcile(conn, state)
        status = conn.execute(
            "SELECT s.status::text FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE n.name = 'node-a' AND s.slot_index = %s",
            (slot,),
        ).fetchone()
        assert status == ("available",)


def test_rewipe_of_an_unknown_slot_is_a_coded_error(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert cli.main(["slot", "rewipe", "nope", "0", "--db-url", db_url]) != 0
    assert "slot.unknown" in capsys.readouterr().err


def test_the_agent_behind_the_service_answers_a_rewipe(
    lab: Lab, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same flow with the agent given no database: plan, reports and the rewipe answer go through serve."""
    state = desired(lab, digest=lab.digest)
    credential = tmp_path / "node.token"
    with connections.connect(db_url, autocommit=True) as conn:
        reconciling.reconcile(conn, state)
        slot = current_node(conn)[1][0]
        assert cli.main(["host", "token", "issue", "node-a", "--out", str(credential), "--db-url", db_url]) == 0
        for s in serve(db_url):
            monkeypatch.delenv("GPUAAS_DATABASE_URL", raising=False)
            converge = (
                "host",
                "converge",
                "--node",
                "node-a",
                "--service",
                s.url,
                "--credential",
                str(credential),
                "--config",
                str(lab.write_config()),
                "-o",
                "json",
            )
            assert _cli(capsys, *converge)[0] == 0
            released = {"state": m.AllocationState.RELEASED}
            state.allocations["alloc-1"] = state.allocations["alloc-1"].model_copy(update=released)
            reconciling.reconcile(conn, state)
            point = lab.loops.mount(lab.slot_disks[slot])
            try:
                rc, doc = _cli(capsys, *converge)
            finally:
                subprocess.run(["umount", str(point)], check=True)
            mine = next(x for x in doc["slots"] if x["slot_index"] == slot)  # type: ignore[attr-defined]
            assert rc == 2 and mine["state"] == "cleanup_blocked"
            rc, asked = _cli(
                capsys,
                "slot",
                "rewipe",
                "node-a",
                str(slot),
                "--reason",
                "disk unmounted",
                "--by",
                "ops",
                "--db-url",
                db_url,
                "-o",
                "json",
            )
            assert rc == 0 and asked["outcome"] == "requested"
            rc, doc = _cli(capsys, *converge)
            mine = next(x for x in doc["slots"] if x["slot_index"] == slot)  # type: ignore[attr-defined]
            assert rc == 0 and mine["state"] == "available" and mine["wipe_state"] == "verified", mine
        answer = conn.execute("SELECT state, answer FROM slot_rewipe_requests").fetchall()
        assert [a[0] for a in answer] == ["accepted"] and answer[0][1]["allocation_id"] == "alloc-1"
        reported = conn.execute(
            "SELECT wipe_state FROM host_slot_status WHERE node_name = 'node-a' AND slot_index = %s", (slot,)
        ).fetchone()
        assert reported == ("verified",)  # the report went through the API too
