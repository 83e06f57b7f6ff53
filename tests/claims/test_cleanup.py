"""Only verified wipe proof returns a released slot to service; usage times come from claims."""

from __future__ import annotations

import pytest

from desired.state import DesiredState
from reconciler.plans import Release
from reconciler.store import checks, claims, cleanup, hostplans
from reconciler.store.connections import Connection
from tests.claims import util
from tests.claims.test_apply import baremetal_placement, slice_placement

NODE = "node-00000"
A = "alloc-0000000"


@pytest.fixture
def released(conn: Connection, fleet: DesiredState) -> None:
    """alloc-0000000 ran on node-00000 slot 3 and was released."""
    assert claims.place(conn, slice_placement(A, NODE, (3,))).placed
    util.report_vm(conn, NODE, 3, A, "ready")
    cleanup.absorb(conn)
    claims.release(conn, Release(A, NODE, (3,)))


def test_no_evidence_keeps_the_slot_in_cleanup(conn: Connection, released: None) -> None:
    assert cleanup.free_cleaned(conn) == ()
    assert util.slot_status(conn, NODE, 3) == "cleanup"


@pytest.mark.parametrize(
    ("who", "kwargs"),
    [
        ("another allocation", {"allocation_id": "alloc-0000009"}),
        ("another disk", {"device": "/dev/disk/by-id/nvme-somewhere-else"}),
        ("signature still there", {"signature_clear": False}),
        ("blocks not zero", {"sampled_zero": False}),
        ("wipe still running", {"state": "running"}),
    ],
)
def test_incomplete_or_foreign_evidence_frees_nothing(
    conn: Connection, released: None, who: str, kwargs: dict[str, object]
) -> None:
    args: dict[str, object] = {"allocation_id": A}
    args.update(kwargs)
    util.report_wipe(conn, NODE, 3, str(args.pop("allocation_id")), **args)  # type: ignore[arg-type]
    assert cleanup.free_cleaned(conn) == ()
    assert util.slot_status(conn, NODE, 3) == "cleanup"


def test_evidence_older_than_the_release_frees_nothing(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement(A, NODE, (3,))).placed
    util.report_wipe(conn, NODE, 3, A)  # before the release was requested
    claims.release(conn, Release(A, NODE, (3,)))
    assert cleanup.free_cleaned(conn) == ()


def test_verified_wipe_frees_the_slot_and_releases_the_allocation(conn: Connection, released: None) -> None:
    util.report_wipe(conn, NODE, 3, A)
    freed = cleanup.free_cleaned(conn)
    assert [(f.node, f.slot_index, f.outcome) for f in freed] == [(NODE, 3, "freed"), (NODE, None, "released")]
    assert util.slot_status(conn, NODE, 3) == "available"
    a = util.allocation(conn, A)
    assert a["status"] == "released" and a["released_at"] is not None
    assert checks.run(conn) == []
    assert cleanup.free_cleaned(conn) == ()  # idempotent


def test_failed_wipe_blocks_that_slot_only_until_a_verified_wipe(conn: Connection, released: None) -> None:
    util.report_wipe(conn, NODE, 3, A, state="failed")
    (blocked,) = cleanup.free_cleaned(conn)
    assert blocked.outcome == "blocked"
    assert util.slot_status(conn, NODE, 3) == "cleanup_blocked"
    assert util.slot_status(conn, NODE, 2) == "available"
    assert cleanup.free_cleaned(conn) == ()  # reported once
    util.report_wipe(conn, NODE, 3, A)  # admin repair, then a verified wipe
    assert [f.outcome for f in cleanup.free_cleaned(conn)] == ["freed", "released"]
    assert util.slot_status(conn, NODE, 3) == "available"


def test_a_slot_removed_from_git_returns_as_disabled(conn: Connection, released: None) -> None:
    conn.execute("UPDATE node_resource_slots SET present = false WHERE slot_index = 3")
    util.report_wipe(conn, NODE, 3, A)
    cleanup.free_cleaned(conn)
    assert util.slot_status(conn, NODE, 3) == "disabled"


def test_release_shows_in_the_host_plan(conn: Connection, released: None) -> None:
    hostplans.write_one(conn, NODE)
    plan = hostplans.read(conn, NODE)
    assert plan is not None and plan.vms == ()
    assert [v.allocation_id for v in plan.releases] == [A]


def test_usage_runs_from_ready_to_release(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement(A, NODE, (3,))).placed
    assert util.count(conn, "SELECT count(*) FROM allocation_usage") == 0  # not active yet: no usage
    util.report_vm(conn, NODE, 3, A, "provisioning")
    cleanup.absorb(conn)
    assert util.allocation(conn, A)["status"] == "provisioning"
    assert util.slot_status(conn, NODE, 3) == "provisioning"
    util.report_vm(conn, NODE, 3, A, "ready")
    cleanup.absorb(conn)
    a = util.allocation(conn, A)
    assert a["status"] == "active" and a["active_at"] is not None
    claims.release(conn, Release(A, NODE, (3,)))
    row = conn.execute(
        "SELECT gpus, usage_started_at, usage_ended_at, gpu_hours, gpu_hourly_price_minor"
        " FROM allocation_usage WHERE allocation_id = %s",
        (A,),
    ).fetchone()
    assert row is not None
    gpus, started, ended, hours, price = row
    assert gpus == 1 and price == 450 and started is not None and ended is not None and ended >= started
    assert float(hours) >= 0


def test_baremetal_lease_is_freed_by_node_cleanup_proof(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, baremetal_placement("alloc-0000024", "node-00004")).placed
    conn.execute(
        "INSERT INTO host_status (node_name, lease_allocation_id, lease_state, lease_ready_at)"
        " VALUES ('node-00004', 'alloc-0000024', 'ready', clock_timestamp())"
    )
    cleanup.absorb(conn)
    assert util.allocation(conn, "alloc-0000024")["status"] == "active"
    claims.release(conn, Release("alloc-0000024", "node-00004", ()))
    assert cleanup.free_cleaned(conn) == ()
    conn.execute(
        "UPDATE host_status SET cleanup_allocation_id = 'alloc-0000024', cleanup_state = 'verified',"
        " cleanup_reported_at = clock_timestamp()"
    )
    assert [f.outcome for f in cleanup.free_cleaned(conn)] == ["freed", "released"]
    assert checks.run(conn) == []
