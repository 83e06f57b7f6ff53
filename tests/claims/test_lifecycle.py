"""The allocation lifecycle fed by host reports: reschedule, quarantine, attempts, liveness (issue 15).

Host reports are written into host_status / host_slot_status as the host
reconciler writes them (a failed VM: its slots `failed`, the VM's error in
details.vms); then one reconciliation runs, as the loop does.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from desired import models as m
from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from host_reconciler import hostdb
from reconciler.commands import status as status_command
from reconciler.reconcile import reconciling
from reconciler.store import checks, hostplans, lifecycle, live
from reconciler.store.connections import Connection
from schemas import dberrors
from tests.claims import util

NOT_VFIO = ("vfio_check", "host.pci.not_vfio", "0000:19:00.1 is bound to mlx5_core, not vfio-pci")


def fleet(
    *, nodes: int = 3, allocations: int = 1, baremetal_nodes: int = 0, baremetal_allocations: int = 0, **settings: Any
) -> DesiredState:
    state = synthetic.fleet(
        nodes=nodes,
        allocations=allocations,
        baremetal_nodes=baremetal_nodes,
        baremetal_allocations=baremetal_allocations,
    )
    if settings and state.fleet is not None:
        state.fleet = state.fleet.model_copy(update=settings)
    return state


def where(conn: Connection, allocation_id: str) -> tuple[str | None, tuple[int, ...]]:
    """(node, slots) of the allocation's current (not retired) live claims."""
    rows = conn.execute(
        "SELECT n.name, c.slot_index FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
        " WHERE c.allocation_id = %s AND c.status IN ('reserved', 'provisioning', 'active')"
        " AND NOT EXISTS (SELECT 1 FROM retired_claims r WHERE r.claim_id = c.id)"
        " ORDER BY c.slot_index",
        (allocation_id,),
    ).fetchall()
    nodes = {str(r[0]) for r in rows}
    assert len(nodes) <= 1
    return (nodes.pop() if nodes else None), tuple(int(r[1]) for r in rows if r[1] is not None)


def report_vm_failure(  # noqa: PLR0917  # the fields of one host error, in the order the host reports them
    conn: Connection,
    node: str,
    slots: tuple[int, ...],
    allocation_id: str,
    phase: str,
    code: str,
    message: str,
    *,
    state: str = "failed",
) -> None:
    """What the host reconciler writes after a PermanentError in a provision phase (or a readiness timeout)."""
    error = {
        "allocation_id": allocation_id,
        "step": phase,
        "code": code,
        "message": message,
        "retry": state != "failed",
        "slot_indexes": list(slots),
    }
    details = {
        "vms": [
            {
                "allocation_id": allocation_id,
                "name": f"gpuaas-{allocation_id}",
                "state": state,
                "phase": phase,
                "phase_timings": {},
                "error": error,
                "hard_stopped": False,
            }
        ]
    }
    conn.execute(
        "INSERT INTO host_status (node_name, observed_generation, reported_at, healthy, details, errors)"
        " VALUES (%s, 1, now(), true, %s, %s) ON CONFLICT (node_name) DO UPDATE SET reported_at = now(),"
        " details = EXCLUDED.details, errors = EXCLUDED.errors",
        (node, Jsonb(details), Jsonb([{k: v for k, v in error.items() if k != "slot_indexes"}])),
    )
    for s in slots:
        util.report_vm(conn, node, s, allocation_id, "failed" if state == "failed" else "provisioning")


def cycle(conn: Connection, allocation_id: str) -> dict[str, Any]:
    return lifecycle.lifecycles(conn, [allocation_id])[allocation_id]


@pytest.fixture
def three(conn: Connection) -> tuple[DesiredState, str]:
    """Three slice nodes, one 1-GPU allocation placed on one of them."""
    state = fleet()
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    return state, aid


def test_permanent_failure_quarantines_releases_and_places_again_elsewhere(
    conn: Connection, three: tuple[DesiredState, str]
) -> None:
    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None and cycle(conn, aid)["state"] == "reserved"
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)

    result = reconciling.reconcile(conn, state)

    assert [(r.outcome, r.node, r.attempt, r.code) for r in result.rescheduled] == [
        ("rescheduled", first, 1, "host.pci.not_vfio")
    ]
    second, new_slots = where(conn, aid)
    assert second is not None and second != first
    # the failed attempt's claims release through cleanup; its slot carries the evidence
    assert util.count(
        conn,
        "SELECT count(*) FROM allocation_resource_claims c JOIN retired_claims r"
        " ON r.claim_id = c.id WHERE c.status = 'releasing'",
    ) == len(slots)
    assert util.slot_status(conn, first, slots[0]) == "cleanup"
    evidence = conn.execute(
        "SELECT s.quarantine FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
        " WHERE n.name = %s AND s.slot_index = %s",
        (first, slots[0]),
    ).fetchone()
    assert evidence is not None and evidence[0]["code"] == "host.pci.not_vfio"
    assert evidence[0]["phase"] == "vfio_check" and evidence[0]["attempt"] == 1
    c = cycle(conn, aid)
    assert (c["state"], c["node"], c["failed_attempts"], c["failed_nodes"]) == ("reserved", second, 1, [first])
    assert [(t["attempt"], t["node"], t["outcome"], t["quarantined"]) for t in c["attempts"]] == [
        (1, first, "rescheduled", True)
    ]
    # the failed node's host is told to release, the new node's to provision
    old_plan, new_plan = hostplans.read(conn, first), hostplans.read(conn, second)
    assert old_plan is not None and [v.allocation_id for v in old_plan.releases] == [aid]
    assert new_plan is not None and [v.allocation_id for v in new_plan.vms] == [aid]
    assert (
        util.count(
            conn, "SELECT count(*) FROM outbox WHERE aggregate_id = %s AND event_type = 'provisioning.failed'", aid
        )
        == 1
    )
    assert checks.run(conn) == []
    counts = lifecycle.summary(conn)
    assert counts["slots_quarantined"] == len(slots) and counts["failed_attempts"] == {"rescheduled": 1}

    # the wipe proof frees the claims; the slot stays quarantined, never sold, until an operator clears it
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, state)
    assert util.slot_status(conn, first, slots[0]) == "quarantined"
    assert (first, slots[0]) in live.observe(conn).slot_status
    assert checks.run(conn) == []
    assert where(conn, aid) == (second, new_slots)  # unchanged by the cleanup
    cleared = lifecycle.clear_quarantine(conn, first, slots[0])
    assert (cleared.outcome, cleared.status) == ("cleared", "available")
    assert cleared.evidence is not None and cleared.evidence["code"] == "host.pci.not_vfio"
    assert lifecycle.clear_quarantine(conn, first, slots[0]).outcome == "not_quarantined"
    assert lifecycle.clear_quarantine(conn, first, 99).outcome == "unknown"


def test_the_new_placement_goes_through_the_whole_lifecycle(conn: Connection, three: tuple[DesiredState, str]) -> None:
    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(
        conn,
        first,
        slots,
        aid,
        "image_verify",
        "host.image.digest_mismatch",
        "sha256 of the cached image is 00ab..., the claim says 0000...01",
    )
    reconciling.reconcile(conn, state)
    second, new_slots = where(conn, aid)
    assert second is not None
    util.report_vm(conn, second, new_slots[0], aid, "provisioning")
    conn.execute(
        "INSERT INTO host_status (node_name, details) VALUES (%s, %s)",
        (second, Jsonb({"vms": [{"allocation_id": aid, "state": "provisioning", "phase": "disk_write"}]})),
    )
    reconciling.reconcile(conn, state)
    c = cycle(conn, aid)
    assert (c["state"], c["host_phase"]) == ("provisioning", "disk_write")
    util.report_vm(conn, second, new_slots[0], aid, "ready")
    reconciling.reconcile(conn, state)
    c = cycle(conn, aid)
    assert c["state"] == "ready" and c["boot_ip"] == f"10.100.0.{10 + new_slots[0]}" and c["host_phase"] is None
    # released in git: releasing while the VM is there, cleanup once the host took it down, then released
    state.allocations[aid] = state.allocations[aid].model_copy(update={"state": m.AllocationState.RELEASED})
    reconciling.reconcile(conn, state)
    assert cycle(conn, aid)["state"] == "releasing"
    util.report_vm(conn, second, new_slots[0], aid, "absent")
    assert cycle(conn, aid)["state"] == "cleanup"
    util.report_wipe(conn, second, new_slots[0], aid)
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, state)
    c = cycle(conn, aid)
    assert c["state"] == "released" and c["failed_attempts"] == 1
    assert checks.run(conn) == []


def test_max_attempts_then_failed_with_every_reason(conn: Connection) -> None:
    state = fleet(max_provision_attempts=2)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)
    reconciling.reconcile(conn, state)
    second, slots2 = where(conn, aid)
    assert second is not None and second != first
    report_vm_failure(
        conn, second, slots2, aid, "host_checks", "host.disk.mounted", "/dev/disk/by-id/nvme-x is mounted at /mnt"
    )
    result = reconciling.reconcile(conn, state)
    assert [r.outcome for r in result.rescheduled] == ["failed"]
    assert where(conn, aid) == (None, ())
    a = util.allocation(conn, aid)
    assert a["status"] == "failed" and a["failure_code"] == "lifecycle.attempts_exhausted"
    assert f"attempt 1 on {first}: host.pci.not_vfio in vfio_check" in a["failure_message"]
    assert f"attempt 2 on {second}: host.disk.mounted in host_checks" in a["failure_message"]
    c = cycle(conn, aid)
    assert c["state"] == "failed" and [t["outcome"] for t in c["attempts"]] == ["rescheduled", "failed"]
    assert checks.run(conn) == []
    # a failed allocation is never placed again, and its claims still release through cleanup
    reconciling.reconcile(conn, state)
    assert where(conn, aid) == (None, ())
    assert util.slot_status(conn, second, slots2[0]) == "cleanup"


def test_a_failure_that_does_not_depend_on_the_node_fails_at_once_without_quarantine(
    conn: Connection, three: tuple[DesiredState, str]
) -> None:
    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, "cloud_init_seed", "host.seed.ssh_key", "key 0 is not an SSH key")
    reconciling.reconcile(conn, state)
    a = util.allocation(conn, aid)
    assert a["status"] == "failed" and a["failure_code"] == "lifecycle.provision_failed"
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, state)
    assert util.slot_status(conn, first, slots[0]) == "available"
    assert checks.run(conn) == []


def test_a_failed_allocation_the_tenant_releases_is_released_and_keeps_its_record(
    conn: Connection, three: tuple[DesiredState, str]
) -> None:
    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, "cloud_init_seed", "host.seed.ssh_key", "key 0 is not an SSH key")
    reconciling.reconcile(conn, state)
    assert util.allocation(conn, aid)["status"] == "failed"
    alloc = state.allocations[aid]
    released = dataclasses.replace(
        state, allocations={aid: alloc.model_copy(update={"state": m.AllocationState.RELEASED})}
    )
    result = reconciling.reconcile(conn, released)
    assert aid in result.applied.cancelled
    a = util.allocation(conn, aid)
    assert a["status"] == "released" and a["failure_code"] == "lifecycle.provision_failed"
    c = cycle(conn, aid)
    assert c["state"] == "released" and [t["outcome"] for t in c["attempts"]] == ["failed"]
    # the failed attempt's slots still go through cleanup, then are free
    assert util.slot_status(conn, first, slots[0]) == "cleanup"
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, released)
    assert util.slot_status(conn, first, slots[0]) == "available"
    assert checks.run(conn) == []


def test_readiness_timeout_reschedules_but_a_temporary_error_does_not(
    conn: Connection, three: tuple[DesiredState, str]
) -> None:
    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(
        conn, first, slots, aid, "readiness", "host.image.missing", "image not cached yet", state="provisioning"
    )
    assert reconciling.reconcile(conn, state).rescheduled == ()
    assert where(conn, aid)[0] == first
    report_vm_failure(
        conn,
        first,
        slots,
        aid,
        "readiness",
        "host.readiness.port_timeout",
        "10.100.0.10:22 did not answer in 300 s",
        state="provisioning",
    )
    result = reconciling.reconcile(conn, state)
    assert [(r.outcome, r.code) for r in result.rescheduled] == [("rescheduled", "host.readiness.port_timeout")]
    assert where(conn, aid)[0] not in (None, first)


def test_baremetal_lease_failure_goes_to_another_node_without_quarantine(conn: Connection) -> None:
    state = fleet(nodes=0, allocations=0, baremetal_nodes=2, baremetal_allocations=1)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    first, _ = where(conn, aid)
    assert first is not None
    conn.execute(
        "INSERT INTO host_status (node_name, lease_allocation_id, lease_state, errors) VALUES (%s, %s, 'failed', %s)",
        (first, aid, Jsonb([{"allocation_id": aid, "step": "reimage", "code": "host.disk.os_disk", "message": "no"}])),
    )
    result = reconciling.reconcile(conn, state)
    assert [(r.outcome, r.code) for r in result.rescheduled] == [("rescheduled", "host.disk.os_disk")]
    second, _ = where(conn, aid)
    assert second is not None and second != first
    assert util.count(conn, "SELECT count(*) FROM node_resource_slots WHERE quarantine IS NOT NULL") == 0
    assert checks.run(conn) == []


def test_the_database_refuses_a_claim_on_a_node_where_the_allocation_failed(
    conn: Connection, three: tuple[DesiredState, str]
) -> None:
    _, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)
    with conn.transaction():
        # only the reschedule step, no placement yet
        (outcome,) = conn.execute(
            "SELECT outcome FROM gpuaas_reschedule(%s, 3, %s)", (aid, list(lifecycle.RESCHEDULE_PATTERNS))
        ).fetchone() or ("",)
    assert outcome == "rescheduled"
    free = next(i for i in range(8) if i not in slots)
    with pytest.raises(dberrors.ConstraintRefused) as caught, dberrors.wrapped("claim on the failed node"):
        util.insert_slot_claim(conn, aid, first, free)
    assert caught.value.code == "claim.node_failed_before"
    # the planner is told as well: the failed node is avoided for this allocation only
    assert live.observe(conn).avoid == {aid: frozenset({first})}


def test_a_commit_that_changes_the_slot_clears_the_quarantine(
    conn: Connection, three: tuple[DesiredState, str]
) -> None:
    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)
    reconciling.reconcile(conn, state)
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, state)
    assert util.slot_status(conn, first, slots[0]) == "quarantined"
    key = (first, slots[0])
    conn.execute(
        "UPDATE node_resource_slots s SET revision = 'r2' FROM nodes n"  # no change to the slot itself
        " WHERE n.id = s.node_id AND n.name = %s AND s.slot_index = %s",
        key,
    )
    assert util.slot_status(conn, *key) == "quarantined"
    conn.execute(
        "UPDATE node_resource_slots s SET fabric_vf_pci_address = '0000:99:00.1' FROM nodes n"
        " WHERE n.id = s.node_id AND n.name = %s AND s.slot_index = %s",
        key,
    )
    assert util.slot_status(conn, *key) == "available"
    assert checks.run(conn) == []


# ------------------------------------------------------------------- liveness


def age_report(conn: Connection, node: str, seconds: float) -> None:
    conn.execute(
        "UPDATE host_status SET reported_at = now() - make_interval(secs => %s) WHERE node_name = %s", (seconds, node)
    )


def test_a_silent_host_is_unavailable_after_the_ttl_and_back_at_its_next_report(conn: Connection, db_url: str) -> None:
    state = fleet(nodes=2, allocations=1)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    busy, _ = where(conn, aid)
    assert busy is not None
    idle = next(n for n in ("node-00000", "node-00001") if n != busy)
    for n in (busy, idle):
        hostdb.heartbeat(conn, n)
    age_report(conn, busy, 60)  # inside the TTL (90 s)
    assert lifecycle.liveness(conn)[busy].liveness == "live"
    age_report(conn, busy, 91)
    hosts = lifecycle.liveness(conn)
    assert hosts[busy].liveness == "unavailable" and hosts[idle].liveness == "live"
    assert busy in live.observe(conn).unavailable_nodes
    # no new placement on it, even where it has the most free slots
    state = fleet(nodes=2, allocations=9)
    reconciling.reconcile(conn, state)
    placed_on = {where(conn, a)[0] for a in state.allocations if a != aid}
    assert placed_on == {idle}
    # its allocation is flagged, never released
    c = cycle(conn, aid)
    assert c["host_unreachable"] is True and c["state"] == "reserved"
    assert where(conn, aid)[0] == busy
    doc = status_command.collect(db_url)
    node = next(n for n in doc["nodes"] if n["name"] == busy)
    assert node["unavailable"] is True and node["healthy"] is False
    assert node["health_reasons"][0]["code"] == "host.silent"
    assert "TTL 90 s" in node["health_reasons"][0]["message"]
    text = status_command.render_text(doc)
    assert "UNAVAILABLE" in text and "host.silent: no report for" in text and "HOST_UNREACHABLE" in text
    alloc = next(a for a in doc["allocations"] if a["id"] == aid)
    assert alloc["lifecycle"]["host_unreachable"] is True
    counts = lifecycle.summary(conn)  # what /metrics exports
    assert counts["nodes_by_liveness"] == {"live": 1, "unavailable": 1}
    assert counts["allocations_host_unreachable"] == 1
    # the next report brings it back
    hostdb.heartbeat(conn, busy)
    assert lifecycle.liveness(conn)[busy].liveness == "live"
    assert busy not in live.observe(conn).unavailable_nodes
    assert cycle(conn, aid)["host_unreachable"] is False


def test_the_fleet_ttl_is_stored_and_used(conn: Connection) -> None:
    state = fleet(nodes=1, allocations=0, host_liveness_ttl_seconds=20)
    reconciling.reconcile(conn, state)
    hostdb.heartbeat(conn, "node-00000")
    age_report(conn, "node-00000", 25)
    assert lifecycle.liveness(conn)["node-00000"].liveness == "unavailable"
    assert lifecycle.liveness(conn)["node-00000"].ttl_s == 20
    assert lifecycle.sync_settings(conn, state) is False  # written once, only when it changes


def test_a_node_that_never_reported_is_not_called_silent(conn: Connection) -> None:
    reconciling.reconcile(conn, fleet(nodes=1, allocations=0))
    assert lifecycle.liveness(conn)["node-00000"].liveness == "unknown"
    assert live.observe(conn).unavailable_nodes == frozenset()


def test_time_for_a_silent_host_to_be_marked_unavailable(conn: Connection) -> None:
    """Real wait with a short TTL: the node turns unavailable within a poll of the TTL passing."""
    state = fleet(nodes=1, allocations=0, host_liveness_ttl_seconds=5)
    reconciling.reconcile(conn, state)
    t0 = time.monotonic()  # before the beat: its time is no earlier, so `took` cannot undercut the TTL
    hostdb.heartbeat(conn, "node-00000")
    while "node-00000" not in live.observe(conn).unavailable_nodes:
        assert time.monotonic() - t0 < 60
        time.sleep(0.1)
    took = time.monotonic() - t0
    print(f"silent host marked unavailable after {took:.2f} s (TTL 5 s)")
    assert took >= 5.0  # never before the TTL; the upper bound is the loop's (load 10 on 2 cores)
    silent = conn.execute(
        "SELECT extract(epoch FROM now() - reported_at) FROM host_status WHERE node_name = 'node-00000'"
    ).fetchone()
    assert silent is not None and 5.0 <= float(silent[0]) < 30.0  # in the database's own clock


def test_connections_of_host_roles_heartbeat_only_their_own_node(conn: Connection, db_url: str) -> None:
    reconciling.reconcile(conn, fleet(nodes=2, allocations=0))
    creds = hostdb.create_node_role(conn, "node-00000", "pw-lifecycle-0")
    with hostdb.connect(db_url, role=creds.role, password=creds.password) as own:
        hostdb.heartbeat(own, "node-00000")
        with pytest.raises(dberrors.DatabaseError):
            hostdb.heartbeat(own, "node-00001")
    assert lifecycle.liveness(conn)["node-00000"].liveness == "live"
    assert lifecycle.liveness(conn)["node-00001"].liveness == "unknown"


def test_an_unhealthy_host_says_why_in_status(conn: Connection, db_url: str) -> None:
    reconciling.reconcile(conn, fleet(nodes=2, allocations=0))
    drift = [
        {
            "code": "drift.network.problem",
            "message": "bridge gpuaasbr0 is missing",
            "slot_index": None,
            "subject": "gpuaasbr0",
        }
    ]
    conn.execute(
        "INSERT INTO host_status (node_name, healthy, drift) VALUES ('node-00001', false, %s)", (Jsonb(drift),)
    )
    doc = status_command.collect(db_url)
    node = next(n for n in doc["nodes"] if n["name"] == "node-00001")
    assert node["healthy"] is False and node["unavailable"] is False
    assert node["health_reasons"] == [
        {
            "code": "drift.network.problem",
            "message": "bridge gpuaasbr0 is missing",
            "evidence": {"subject": "gpuaasbr0"},
        }
    ]
    text = status_command.render_text(doc)
    assert "UNHEALTHY\n      drift.network.problem: bridge gpuaasbr0 is missing" in text
    assert next(n for n in doc["nodes"] if n["name"] == "node-00000")["health_reasons"] == []


def test_slot_clear_command(
    conn: Connection, db_url: str, three: tuple[DesiredState, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from reconciler import cli

    state, aid = three
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)
    reconciling.reconcile(conn, state)
    util.report_wipe(conn, first, slots[0], aid)
    reconciling.reconcile(conn, state)
    assert util.slot_status(conn, first, slots[0]) == "quarantined"
    assert "quarantined=1" in status_command.render_text(status_command.collect(db_url))
    assert cli.main(["slot", "clear", first, str(slots[0]), "--db-url", db_url]) == 0
    out = capsys.readouterr().out
    assert f"{first}:{slots[0]} cleared, now available" in out and "host.pci.not_vfio" in out
    assert cli.main(["slot", "clear", first, str(slots[0]), "--db-url", db_url, "-o", "json"]) == 0
    assert '"outcome": "not_quarantined"' in capsys.readouterr().out
    assert cli.main(["slot", "clear", first, "42", "--db-url", db_url]) == 1
    assert "slot.unknown" in capsys.readouterr().err
