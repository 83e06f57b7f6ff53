"""`gpuaas history --allocation ID`: one allocation's recorded lifecycle, with every attempt and its reason.

One story, written as the hosts report it (tests/claims/test_lifecycle.py):

    node A: placed (attempt 1) -> VF not on vfio-pci -> rescheduled, slot quarantined -> wipe proven
    node B: placed (attempt 2) -> ready -> released in git -> VM gone -> wipe proven -> released
"""

from __future__ import annotations

import json

import pytest

from desired import models as m
from gpuaas_tools.bench import synthetic
from reconciler import cli
from reconciler.reconcile import reconciling
from reconciler.store import lifecycle
from reconciler.store.connections import Connection
from tests.claims import util
from tests.claims.test_lifecycle import NOT_VFIO, report_vm_failure, where


def test_the_history_of_a_rescheduled_allocation_lists_each_step_and_attempt(
    conn: Connection, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = synthetic.fleet(nodes=3, allocations=1, baremetal_nodes=0, baremetal_allocations=0)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)
    reconciling.reconcile(conn, state)
    second, new_slots = where(conn, aid)
    assert second is not None and second != first
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, state)
    util.report_vm(conn, second, new_slots[0], aid, "ready")
    reconciling.reconcile(conn, state)
    state.allocations[aid] = state.allocations[aid].model_copy(update={"state": m.AllocationState.RELEASED})
    reconciling.reconcile(conn, state)
    util.report_vm(conn, second, new_slots[0], aid, "absent")
    util.report_wipe(conn, second, new_slots[0], aid)
    reconciling.reconcile(conn, state)

    steps = lifecycle.transitions(conn, aid)
    assert steps is not None
    assert [(t.event, t.state, t.node, t.attempt) for t in steps] == [
        ("requested", "pending", None, None),
        ("placed", "reserved", first, 1),
        ("attempt_failed", "pending", first, 1),
        ("placed", "reserved", second, 2),
        ("cleanup_proven", "cleanup", first, 1),  # the failed attempt's slots, proven while B provisions
        ("ready", "ready", second, 2),
        ("release_requested", "releasing", second, None),
        ("cleanup_proven", "cleanup", second, 2),
        ("released", "released", None, None),
    ]
    failed = next(t for t in steps if t.event == "attempt_failed")
    assert (failed.code, failed.message) == ("host.pci.not_vfio", NOT_VFIO[2])
    assert failed.details == {
        "phase": "vfio_check",
        "slot_indexes": list(slots),
        "quarantined": True,
        "next": "reschedule",
    }
    assert steps[1].details is not None and steps[1].details["slot_indexes"] == list(slots)

    assert cli.main(["history", "--allocation", aid, "--db-url", db_url]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{aid}  RELEASED") and "1 failed attempt(s)" in text
    assert (
        f"attempt_failed     pending    {first:<16}    1  slots {','.join(map(str, slots))};"
        f" host.pci.not_vfio in vfio_check: {NOT_VFIO[2]}; next reschedule, slots quarantined" in text
    )
    assert f"placed             reserved   {second:<16}    2  slots {new_slots[0]}" in text

    assert cli.main(["history", "--allocation", aid, "--db-url", db_url, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["allocation_id"] == aid and doc["lifecycle"]["state"] == "released"
    assert [t["event"] for t in doc["transitions"]] == [t.event for t in steps]
    assert doc["transitions"][2]["code"] == "host.pci.not_vfio"


def test_an_allocation_that_failed_for_good(conn: Connection, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    state = synthetic.fleet(nodes=1, allocations=1, baremetal_nodes=0, baremetal_allocations=0)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    node, slots = where(conn, aid)
    assert node is not None
    report_vm_failure(conn, node, slots, aid, "cloud_init_seed", "host.seed.ssh_key", "key 0 is not an SSH key")
    reconciling.reconcile(conn, state)
    steps = lifecycle.transitions(conn, aid)
    assert steps is not None
    assert [(t.event, t.state) for t in steps] == [
        ("requested", "pending"),
        ("placed", "reserved"),
        ("attempt_failed", "failed"),
    ]
    assert steps[-1].details is not None and steps[-1].details["next"] == "failed"
    assert steps[-1].details["quarantined"] is False
    assert cli.main(["history", "--allocation", aid, "--db-url", db_url]) == 0
    assert f"{aid}  FAILED on {node}; 1 failed attempt(s); lifecycle.provision_failed: " in capsys.readouterr().out


def test_a_request_no_node_can_take_is_waiting_with_the_planners_reason(
    conn: Connection, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = synthetic.fleet(nodes=1, allocations=9, baremetal_nodes=0, baremetal_allocations=0)
    reconciling.reconcile(conn, state)  # one node of 8 slots, nine 1-GPU requests
    (waiting,) = [a for a in state.allocations if where(conn, a) == (None, ())]
    steps = lifecycle.transitions(conn, waiting)
    assert steps is not None and [t.event for t in steps] == ["requested", "waiting"]
    assert steps[-1].code is not None and steps[-1].code.startswith("plan.")
    assert cli.main(["history", "--allocation", waiting, "--db-url", db_url]) == 0
    assert f"{waiting}  PENDING" in capsys.readouterr().out


def test_an_unknown_allocation_is_a_usage_error(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["history", "--allocation", "no-such", "--db-url", db_url]) != 0
    err = capsys.readouterr().err
    assert "history.unknown_allocation" in err and "Traceback" not in err
