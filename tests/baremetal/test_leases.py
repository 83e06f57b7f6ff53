"""Baremetal leases end to end through the MAAS simulator and real PostgreSQL (issue 30).

reconcile -> deploy (once) -> Deployed + SSH answers -> active, usage accrues
release in git -> release with erase (once) -> Ready -> erase evidence frees the claim -> node available
"""

from __future__ import annotations

import time

from desired.state import DesiredState
from gpuaas_tools.bench import leases as fleets
from gpuaas_tools.lab.maas_sim import MaasSimulator
from reconciler import cli
from reconciler.reconcile import reconciling
from reconciler.store import checks, inventory, leases, live
from reconciler.store.connections import Connection
from tests.baremetal.conftest import Listener, maas_provider

A0, A1 = "alloc-0000000", "alloc-0000001"


def _until(conn: Connection, state: DesiredState, done: object, *, tries: int = 200) -> None:
    """Reconcile until `done(conn)` holds (the simulator moves on a clock; generous for a loaded machine)."""
    for _ in range(tries):
        reconciling.reconcile(conn, state)
        if done(conn):  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("the lease never reached the expected state")


def _status(conn: Connection, aid: str) -> str:
    row = conn.execute("SELECT status FROM allocations WHERE id = %s", (aid,)).fetchone()
    return str(row[0]) if row else "?"


def _phase(conn: Connection, aid: str) -> str | None:
    return leases.details(conn, [aid]).get(aid, {}).get("phase")


def test_lease_deploys_once_goes_active_and_releases_with_erase(
    conn: Connection, maas: MaasSimulator, ssh: Listener
) -> None:
    state = fleets.fleet(
        provider=maas_provider(maas), baremetal_nodes=2, leases=1, ssh_address=ssh.address, wipe_policy="quick_erase"
    )
    _until(conn, state, lambda c: _status(c, A0) == "active")
    lease = leases.details(conn, [A0])[A0]
    assert lease["phase"] == "active" and lease["ssh_endpoint"] == ssh.address
    assert lease["deploy_requests"] == 1 and sum(maas.deploys.values()) == 1
    machine = maas.machines[lease["machine_id"]]
    assert fleets.SSH_KEY in machine.user_data and machine.distro == "noble"
    usage = conn.execute("SELECT usage_started_at FROM allocation_usage WHERE allocation_id = %s", (A0,)).fetchone()
    assert usage is not None and usage[0] is not None

    gone = fleets.released(state)
    _until(conn, gone, lambda c: _status(c, A0) == "released")
    lease = leases.details(conn, [A0])[A0]
    assert lease["phase"] == "erased" and lease["erase_requests"] == 1 and sum(maas.releases.values()) == 1
    assert machine.erase == "quick_erase" and machine.status == "Ready"
    assert lease["erase_evidence"]["verified"] is True and lease["erase_evidence"]["method"] == "quick_erase"
    live = conn.execute("SELECT count(*) FROM allocation_resource_claims WHERE status <> 'released'").fetchone()
    assert live is not None and live[0] == 0
    assert checks.run(conn) == []


def test_unreachable_provider_waits_with_the_reason_and_deploys_nothing(
    conn: Connection, maas: MaasSimulator, ssh: Listener
) -> None:
    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=1, leases=1, ssh_address=ssh.address)
    maas.down = True
    for _ in range(3):
        reconciling.reconcile(conn, state)
    lease = leases.details(conn, [A0])[A0]
    assert lease["phase"] == "deploy_requested" and lease["wait_code"] == "baremetal.provider.unreachable"
    assert "503" in lease["wait_message"] and maas.deploys == {}
    maas.down = False
    _until(conn, state, lambda c: _status(c, A0) == "active")
    assert sum(maas.deploys.values()) == 1 and leases.details(conn, [A0])[A0]["wait_code"] is None


def test_failed_deploy_quarantines_the_machine_and_places_the_lease_elsewhere(
    conn: Connection, db_url: str, maas: MaasSimulator, ssh: Listener
) -> None:
    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=2, leases=1, ssh_address=ssh.address)
    inventory.sync(conn, state)
    first = "bm-00000"
    maas.fail_deploy.add(first)
    _until(
        conn,
        state,
        lambda c: (
            _status(c, A0) == "active"
            and c.execute("SELECT count(*) FROM baremetal_leases WHERE phase = 'erased'").fetchone() == (1,)
        ),
    )
    nodes = conn.execute(
        "SELECT node_name, phase FROM baremetal_leases WHERE allocation_id = %s ORDER BY deploy_requested_at", (A0,)
    ).fetchall()
    assert [p for _, p in nodes] == ["erased", "active"], nodes  # the failed machine was erased, then freed
    q = conn.execute("SELECT node_name, code, message FROM machine_quarantine").fetchall()
    assert len(q) == 1 and q[0][1] == "baremetal.deploy.failed" and "curtin" in q[0][2]
    attempt = conn.execute("SELECT code, outcome FROM allocation_attempts WHERE allocation_id = %s", (A0,)).fetchall()
    assert attempt == [("baremetal.deploy.failed", "rescheduled")]
    assert maas.deploys == {first: 1, "bm-00001": 1} and maas.releases == {first: 1}
    assert checks.run(conn) == []
    assert "node-00000" in live.observe(conn).unavailable_nodes  # the planner places nothing there
    assert cli.main(["machine", "clear", "node-00000", "--db-url", db_url, "-o", "json"]) == 0
    assert "node-00000" not in live.observe(conn).unavailable_nodes
    assert cli.main(["machine", "clear", "node-00000", "--db-url", db_url]) != 0  # nothing to clear


def test_failed_erase_leaves_the_node_blocked(
    conn: Connection, db_url: str, maas: MaasSimulator, ssh: Listener
) -> None:
    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=1, leases=1, ssh_address=ssh.address)
    _until(conn, state, lambda c: _status(c, A0) == "active")
    maas.fail_erase.add("bm-00000")
    gone = fleets.released(state)
    _until(conn, gone, lambda c: _phase(c, A0) == "erase_failed")
    for _ in range(2):
        reconciling.reconcile(conn, gone)
    claim = conn.execute("SELECT status FROM allocation_resource_claims WHERE allocation_id = %s", (A0,)).fetchone()
    assert claim == ("releasing",) and _status(conn, A0) == "releasing"
    assert leases.node_states(conn)["node-00000"]["lease"]["phase"] == "erase_failed"
    from reconciler.commands import status

    assert "CLEANUP_BLOCKED (erase of alloc-0000000 failed)" in status.render_text(status.collect(db_url))
    assert maas.releases == {"bm-00000": 1}


def test_a_machine_deployed_behind_our_back_is_drift_never_released(
    conn: Connection, maas: MaasSimulator, ssh: Listener
) -> None:
    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=2, leases=0, ssh_address=ssh.address)
    other = maas.machines["bm-00001"]
    other.status, other.owner = "Deployed", "someone-else"
    del maas.machines["bm-00000"]
    reconciling.reconcile(conn, state)
    codes = {(d["machine_id"], d["code"]) for d in leases.drift(conn)}
    assert codes == {("bm-00000", "baremetal.machine.missing"), ("bm-00001", "baremetal.machine.unexpected_deploy")}
    assert other.status == "Deployed" and maas.releases == {} and maas.deploys == {}


def test_status_api_and_history_show_the_lease(
    conn: Connection, db_url: str, maas: MaasSimulator, ssh: Listener
) -> None:
    from reconciler.commands import status
    from reconciler.service import reads
    from reconciler.store import lifecycle

    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=1, leases=1, ssh_address=ssh.address)
    _until(conn, state, lambda c: _status(c, A0) == "active")
    doc = status.collect(db_url)
    a = next(x for x in doc["allocations"] if x["id"] == A0)
    assert a["baremetal"]["phase"] == "active" and a["baremetal"]["ssh_endpoint"] == ssh.address
    assert "baremetal: active via maas-test/bm-00000" in status.render_text(doc)
    assert maas.api_key.split(":")[2] not in str(doc)  # no credentials in any output
    detail = reads.allocation(conn, A0)
    assert detail is not None and detail["baremetal"]["machine_id"] == "bm-00000"
    assert detail["baremetal"]["timings_s"]["to_active"] is not None
    from reconciler.service import models

    models.Allocation.model_validate(detail)  # the API document declares every field it sends
    host, port = ssh.address.split(":")
    assert detail["ssh"] == {"address": host, "port": int(port)}
    events = [t.event for t in lifecycle.transitions(conn, A0) or []]
    assert events[:5] == [
        "requested",
        "placed",
        "baremetal.deploy_requested",
        "baremetal.deploying",
        "baremetal.active",
    ], events


def test_a_leased_both_capable_node_is_never_sold_as_slots_and_owes_its_slice_profile(
    conn: Connection, maas: MaasSimulator, ssh: Listener
) -> None:
    from reconciler.service import reads
    from reconciler.store import live

    state = fleets.fleet(
        provider=maas_provider(maas),
        baremetal_nodes=0,
        slice_nodes=1,
        slice_machines=True,
        leases=1,
        ssh_address=ssh.address,
    )
    _until(conn, state, lambda c: _status(c, A0) == "active")
    node = reads.nodes(conn)["items"][0]
    assert node["leased"] and [s["state"] for s in node["slots"]] == ["leased"] * 8  # not 8 green "available"
    assert reads.fleet_summary(conn)["slots"].get("available", 0) == 0
    gone = fleets.released(state)
    _until(conn, gone, lambda c: _status(c, A0) == "released")
    # The tenant's OS was written over the slice host: no slice lands there until its agent reports again.
    assert live.observe(conn).firmware_ready.get("node-00000") is False
    assert leases.node_states(conn)["node-00000"] == {"needs_slice_profile": True}
    conn.execute(
        "INSERT INTO host_status (node_name, firmware_ready, reported_at) VALUES ('node-00000', true,"
        " clock_timestamp())"
    )
    reconciling.reconcile(conn, gone)
    assert "node-00000" not in leases.node_states(conn)
    assert live.observe(conn).firmware_ready.get("node-00000") is True


def test_a_lease_no_longer_declared_is_never_deployed(conn: Connection, maas: MaasSimulator, ssh: Listener) -> None:
    import dataclasses

    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=1, leases=1, ssh_address=ssh.address)
    maas.down = True
    reconciling.reconcile(conn, state)
    assert _phase(conn, A0) == "deploy_requested"
    maas.down = False
    orphaned = dataclasses.replace(state, allocations={})
    for _ in range(3):
        reconciling.reconcile(conn, orphaned)
    assert maas.deploys == {} and _phase(conn, A0) == "deploy_requested"


def test_two_reconcilers_at_once_deploy_and_erase_each_lease_once(
    db_url: str, conn: Connection, maas: MaasSimulator, ssh: Listener
) -> None:
    import threading

    from reconciler.store import connections

    state = fleets.fleet(provider=maas_provider(maas), baremetal_nodes=4, leases=4, ssh_address=ssh.address)
    inventory.sync(conn, state)

    def loop(target: DesiredState, want: str, errors: list[BaseException]) -> None:
        try:
            with connections.connect(db_url, autocommit=True) as own:
                for _ in range(300):
                    reconciling.reconcile(own, target)
                    if own.execute("SELECT count(*) FROM allocations WHERE status <> %s", (want,)).fetchone() == (0,):
                        return
                    time.sleep(0.02)
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    for target, want in ((state, "active"), (fleets.released(state), "released")):
        errors: list[BaseException] = []
        threads = [threading.Thread(target=loop, args=(target, want, errors)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not errors, errors
    assert sorted(maas.deploys.values()) == [1] * 4 and sorted(maas.releases.values()) == [1] * 4
    assert checks.run(conn) == []
