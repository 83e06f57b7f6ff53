"""Public SSH endpoints: opened with the claims, never shared, freed only after cleanup proof.

node-00000  ingress 198.51.100.1:20000-20003   (4 ports)
node-00001  ingress 198.51.100.1:20004-20007   (same address, the next ports)
node-00002  no ingress
"""

from __future__ import annotations

import psycopg
import pytest

from desired import models as m
from desired.state import DesiredState
from reconciler.plans import Release
from reconciler.store import checks, claims, cleanup, endpoints, hostplans, inventory
from reconciler.store.connections import Connection
from tests.claims import util
from tests.claims.conftest import small_fleet
from tests.claims.test_apply import slice_placement

ADDR = "198.51.100.1"


def _with_ingress(state: DesiredState) -> DesiredState:
    for name, first in (("node-00000", 20000), ("node-00001", 20004)):
        node = state.nodes[name]
        state.nodes[name] = node.model_copy(
            update={
                "public_addresses": (ADDR,),
                "ingress": m.NodeIngress(address=ADDR, port_first=first, port_last=first + 3),
            }
        )
    a = state.allocations["alloc-0000001"]
    state.allocations["alloc-0000001"] = a.model_copy(update={"extra_ports": (8888, 6006)})
    return state


@pytest.fixture
def ingress_fleet(conn: Connection) -> DesiredState:
    state = _with_ingress(small_fleet())
    inventory.sync(conn, state)
    return state


def _live(conn: Connection) -> list[tuple[str, str, int, int]]:
    rows = conn.execute(
        "SELECT allocation_id, host(public_address), public_port, guest_port FROM allocation_endpoints"
        " WHERE freed_at IS NULL ORDER BY public_port"
    ).fetchall()
    return [(str(a), str(h), int(p), int(g)) for a, h, p, g in rows]


def test_placement_opens_the_ssh_endpoint_and_extra_ports(conn: Connection, ingress_fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", "node-00000", (3,))).placed
    assert claims.place(conn, slice_placement("alloc-0000001", "node-00000", (5,))).placed
    assert _live(conn) == [
        ("alloc-0000000", ADDR, 20000, 22),
        ("alloc-0000001", ADDR, 20001, 22),
        ("alloc-0000001", ADDR, 20002, 8888),
        ("alloc-0000001", ADDR, 20003, 6006),
    ]
    found = endpoints.current(conn)
    ssh = found["alloc-0000000"][0]
    slot3_ip = conn.execute(
        "SELECT host(private_ip) FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
        " WHERE n.name = 'node-00000' AND s.slot_index = 3"
    ).fetchone()
    assert slot3_ip is not None and ssh.ssh and ssh.private_ip == slot3_ip[0]
    hostplans.write_one(conn, "node-00000")
    plan = hostplans.read(conn, "node-00000")
    assert plan is not None
    assert [(r.allocation_id, r.public_port, r.guest_port) for r in plan.ingress] == [
        ("alloc-0000000", 20000, 22),
        ("alloc-0000001", 20001, 22),
        ("alloc-0000001", 20002, 8888),
        ("alloc-0000001", 20003, 6006),
    ]


def test_a_node_without_ingress_gives_no_endpoint(conn: Connection, ingress_fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", "node-00002", (0,))).placed
    assert _live(conn) == []
    hostplans.write_one(conn, "node-00002")
    plan = hostplans.read(conn, "node-00002")
    assert plan is not None and plan.ingress == ()


def test_a_full_range_refuses_the_node_and_the_next_candidate_takes_it(
    conn: Connection, ingress_fleet: DesiredState
) -> None:
    from reconciler.plans import Candidate

    assert claims.place(conn, slice_placement("alloc-0000001", "node-00000", (0,))).placed  # 3 of 4 ports
    assert claims.place(conn, slice_placement("alloc-0000000", "node-00000", (1,))).placed  # the 4th
    r = claims.place(conn, slice_placement("alloc-0000002", "node-00000", (2,), Candidate("node-00001", (2,))))
    assert r.placed and r.node == "node-00001"
    first = r.attempts[0]
    assert first.outcome is claims.Outcome.LOST_RACE and "ingress.ports_exhausted" in (first.detail or "")
    assert ("alloc-0000002", ADDR, 20004, 22) in _live(conn)
    assert util.slot_status(conn, "node-00000", 2) == "available"  # the refused attempt left nothing


def test_the_database_refuses_a_shared_port(conn: Connection, ingress_fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", "node-00000", (3,))).placed
    with pytest.raises(psycopg.errors.UniqueViolation) as e:
        conn.execute(
            "INSERT INTO allocation_endpoints (allocation_id, node_id, public_address, public_port,"
            " guest_port, private_ip) SELECT 'alloc-0000002', id, %s, 20000, 22, '10.100.0.99'"
            " FROM nodes WHERE name = 'node-00001'",
            (ADDR,),
        )
    assert e.value.diag.constraint_name == "endpoints_one_live_per_port"


def test_the_port_is_freed_only_after_cleanup_proof(conn: Connection, ingress_fleet: DesiredState) -> None:
    a = "alloc-0000000"
    assert claims.place(conn, slice_placement(a, "node-00000", (3,))).placed
    util.report_vm(conn, "node-00000", 3, a, "ready")
    cleanup.absorb(conn)
    claims.release(conn, Release(a, "node-00000", (3,)))
    assert _live(conn) == [(a, ADDR, 20000, 22)]  # releasing: the host may still hold the rule
    hostplans.write_one(conn, "node-00000")
    plan = hostplans.read(conn, "node-00000")
    assert plan is not None and plan.ingress == () and [v.allocation_id for v in plan.releases] == [a]
    assert endpoints.current(conn)[a][0].public_port == 20000  # still shown while it is not freed
    cleanup.free_cleaned(conn)
    assert _live(conn) == [(a, ADDR, 20000, 22)]  # no wipe proof yet
    util.report_wipe(conn, "node-00000", 3, a)
    cleanup.free_cleaned(conn)
    assert _live(conn) == []
    freed = conn.execute("SELECT count(*) FROM allocation_endpoints WHERE freed_at IS NOT NULL").fetchone()
    assert freed is not None and freed[0] == 1
    assert claims.place(conn, slice_placement("alloc-0000002", "node-00000", (3,))).placed
    assert _live(conn) == [("alloc-0000002", ADDR, 20000, 22)]  # the freed port serves again
    assert checks.run(conn) == []


def test_the_invariant_check_sees_an_endpoint_left_without_its_claim(
    conn: Connection, ingress_fleet: DesiredState
) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", "node-00000", (3,))).placed
    assert checks.run(conn) == []
    conn.execute(
        "INSERT INTO allocation_endpoints (allocation_id, node_id, public_address, public_port, guest_port,"
        " private_ip) SELECT 'alloc-0000003', id, %s, 20001, 22, '10.100.0.99' FROM nodes"
        " WHERE name = 'node-00000'",
        (ADDR,),
    )
    (found,) = checks.run(conn)
    assert found.name == "endpoint_without_claim" and found.sample == (f"alloc-0000003 {ADDR}:20001",)
