"""apply: one transaction per placement, next candidate after a lost race, nothing half-written."""

from __future__ import annotations

import pytest

from desired.state import DesiredState
from reconciler.plans import Candidate, Pending, Placement, Plan, Release, ResolvedProfile
from reconciler.store import checks, claims, hostplans
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.errors import GpuaasError
from tests.claims import util

NODE = "node-00000"
PROFILE = ResolvedProfile(name="bench_1g_24c_64g", gpu_count=1, vcpu_count=24, memory_mib=65536)


def slice_placement(alloc: str, node: str, slots: tuple[int, ...], *alts: Candidate) -> Placement:
    return Placement(
        allocation_id=alloc,
        tenant="t",
        sku="bench-h200-slice",
        capacity_shape="gpu_slice",
        gpu_count=len(slots),
        region="bench-1",
        node=node,
        slot_indexes=slots,
        profile=PROFILE,
        image="bench-ubuntu-24.04",
        alternatives=tuple(alts),
    )


def baremetal_placement(alloc: str, node: str, *alts: str) -> Placement:
    return Placement(
        allocation_id=alloc,
        tenant="t",
        sku="bench-h200-baremetal-8g",
        capacity_shape="baremetal",
        gpu_count=8,
        region="bench-1",
        node=node,
        slot_indexes=(),
        profile=None,
        image=None,
        alternatives=tuple(Candidate(n, ()) for n in alts),
    )


def test_a_placement_writes_claims_snapshot_slots_allocation_and_event(conn: Connection, fleet: DesiredState) -> None:
    r = claims.place(conn, slice_placement("alloc-0000000", NODE, (2,)), revision="rev1")
    assert r.placed and r.node == NODE and r.slot_indexes == (2,) and len(r.claim_ids) == 1
    snap = conn.execute("SELECT resource_snapshot FROM allocation_resource_claims").fetchone()
    assert snap is not None
    s = snap[0]
    assert s["profile"]["vcpu_count"] == 24 and s["image"]["digest_sha256"].endswith("1")
    assert s["slot"]["nvme_device"].startswith("/dev/disk/by-id/") and s["slot"]["mac_address"]
    assert s["slot"]["private_ip"] == "10.100.0.12" and s["price"]["gpu_hourly_price_minor"] == 450
    assert util.slot_status(conn, NODE, 2) == "reserved"
    a = util.allocation(conn, "alloc-0000000")
    assert (a["status"], a["placed_revision"], a["capacity_shape"]) == ("reserved", "rev1", "gpu_slice")
    assert (
        util.count(
            conn,
            "SELECT count(*) FROM outbox WHERE event_type = 'provisioning.requested'"
            " AND aggregate_id = 'alloc-0000000'",
        )
        == 1
    )
    assert checks.run(conn) == []


def test_lost_race_takes_the_next_candidate(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (0,))).placed
    r = claims.place(conn, slice_placement("alloc-0000001", NODE, (0,), Candidate(NODE, (1,))))
    assert r.placed and r.slot_indexes == (1,)
    assert [a.outcome for a in r.attempts] == [claims.Outcome.LOST_RACE, claims.Outcome.PLACED]
    assert r.conflicts == 1


def test_after_bounded_tries_the_allocation_stays_pending_with_the_reason(
    conn: Connection, fleet: DesiredState
) -> None:
    for i in range(3):
        assert claims.place(conn, slice_placement(f"alloc-000000{i}", NODE, (i,))).placed
    alts = [Candidate(NODE, (i,)) for i in range(1, 3)] + [Candidate("node-00001", (0,))]
    r = claims.place(conn, slice_placement("alloc-0000009", NODE, (0,), *alts), max_claim_attempts=3)
    assert not r.placed and len(r.attempts) == 3  # the fourth candidate is never tried
    assert r.pending_code == claims.CONFLICT_EXHAUSTED
    a = util.allocation(conn, "alloc-0000009")
    assert a["status"] == "pending" and a["pending_code"] == "claim.conflict_exhausted"
    assert "lost the race" in a["pending_message"]


def test_a_placed_allocation_is_never_placed_twice(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (0,))).placed
    again = claims.place(conn, slice_placement("alloc-0000000", "node-00001", (0,)))
    assert again.outcome is claims.Outcome.NOT_PENDING
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 1


def test_refused_candidates_are_reported(conn: Connection, fleet: DesiredState) -> None:
    conn.execute("UPDATE nodes SET admin_state = 'draining' WHERE name = %s", (NODE,))
    r = claims.place(conn, slice_placement("alloc-0000000", NODE, (0,)))
    assert not r.placed and r.pending_code == claims.CANDIDATES_REFUSED
    assert "draining" in (r.attempts[0].detail or "")


def test_wrong_slot_count_is_refused_by_the_database(conn: Connection, fleet: DesiredState) -> None:
    r = claims.place(conn, slice_placement("alloc-0000000", NODE, (0, 1)))
    assert r.attempts[0].outcome is claims.Outcome.REFUSED


def test_baremetal_lease_blocks_slices_and_needs_an_idle_node(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (0,))).placed
    r = claims.place(conn, baremetal_placement("alloc-0000024", NODE, "node-00001"))
    assert r.placed and r.node == "node-00001" and r.conflicts == 1
    blocked = claims.place(conn, slice_placement("alloc-0000001", "node-00001", (3,)))
    assert not blocked.placed
    assert checks.run(conn) == []


@pytest.mark.parametrize("shape", ["slice", "baremetal"])
def test_failure_between_claim_insert_and_commit_leaves_nothing(
    conn: Connection, fleet: DesiredState, shape: str
) -> None:
    # The fault fires inside gpuaas_place_batch, the procedure production runs, after the attempt wrote.
    p = slice_placement("alloc-0000000", NODE, (0,)) if shape == "slice" else baremetal_placement("alloc-0000024", NODE)
    with pytest.raises(dberrors.DatabaseError) as info:
        claims.place(conn, p, fault="claims_inserted")
    # The claims were visible inside the transaction at that point...
    assert f"fault injected at claims_inserted after 1 claim(s) of {p.allocation_id} were written" in str(info.value)
    # ...and gone afterwards, with every other write of the placement.
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 0
    assert util.count(conn, "SELECT count(*) FROM outbox") == 0
    assert util.slot_status(conn, NODE, 0) == "available"
    assert util.allocation(conn, p.allocation_id)["status"] == "pending"
    assert checks.run(conn) == []
    assert claims.place(conn, p).placed  # and the allocation can still be placed


def test_failure_before_commit_keeps_the_placements_committed_before_it(conn: Connection, fleet: DesiredState) -> None:
    first = slice_placement("alloc-0000000", NODE, (0,))
    second = slice_placement("alloc-0000001", NODE, (1,))
    assert claims.place(conn, first).placed
    with pytest.raises(dberrors.DatabaseError, match="claims_inserted after 1 claim"):
        claims.place_many(conn, [second], fault="claims_inserted")
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 1
    assert (util.slot_status(conn, NODE, 0), util.slot_status(conn, NODE, 1)) == ("reserved", "available")
    assert checks.run(conn) == []


@pytest.mark.parametrize("shape", ["slice", "baremetal"])
def test_a_conflict_after_the_claim_insert_is_a_lost_race_and_the_next_candidate_places(
    conn: Connection, fleet: DesiredState, shape: str
) -> None:
    """The database refuses the first attempt after it wrote (a serialization failure, as a concurrent
    writer causes): that attempt leaves nothing and the next candidate is placed in a second round trip."""
    if shape == "slice":
        p = slice_placement("alloc-0000000", NODE, (0,), Candidate(NODE, (1,)))
        taken, free_slot = (NODE, 0), (NODE, 1)
    else:
        p = baremetal_placement("alloc-0000024", "node-00004", "node-00005")
    r = claims.place(conn, p, fault="claims_conflict")
    assert r.placed and r.conflicts == 1 and len(r.attempts) == 2, r
    lost = r.attempts[0]
    assert lost.outcome is claims.Outcome.LOST_RACE and lost.node == p.node
    assert (lost.detail or "").startswith("db.conflict:") and "after 1 claim(s)" in (lost.detail or "")
    assert r.node == p.alternatives[0].node and r.slot_indexes == p.alternatives[0].slot_indexes
    # Only the second candidate's claims exist; the refused attempt wrote nothing that stayed.
    nodes = conn.execute(
        "SELECT n.name, c.slot_index FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
    ).fetchall()
    if shape == "slice":
        assert nodes == [free_slot] and util.slot_status(conn, *taken) == "available"
    else:
        assert nodes == [("node-00005", None)]
    assert util.count(conn, "SELECT count(*) FROM outbox") == 1
    assert checks.run(conn) == []


def test_a_conflict_on_every_candidate_leaves_the_allocation_pending(conn: Connection, fleet: DesiredState) -> None:
    # Three placements in one batch; the fault hits the first one that places (the second placement's
    # only candidate): it goes pending with claim.conflict_exhausted, the others are placed.
    batch = [
        slice_placement("alloc-0000000", "node-00001", (0,)),
        slice_placement("alloc-0000001", NODE, (0,)),
        slice_placement("alloc-0000002", NODE, (1,)),
    ]
    conn.execute("UPDATE nodes SET admin_state = 'draining' WHERE name = 'node-00001'")
    results = claims.place_many(conn, batch, fault="claims_conflict")
    assert [r.placed for r in results] == [False, False, True]
    assert results[0].pending_code == claims.CANDIDATES_REFUSED
    assert results[1].pending_code == claims.CONFLICT_EXHAUSTED and results[1].conflicts == 1
    assert util.allocation(conn, "alloc-0000001")["pending_code"] == claims.CONFLICT_EXHAUSTED
    assert util.slot_status(conn, NODE, 0) == "available"
    assert checks.run(conn) == []


def test_an_unknown_fault_point_is_refused(conn: Connection, fleet: DesiredState) -> None:
    with pytest.raises(dberrors.DatabaseError, match="unknown fault point"):
        claims.place(conn, slice_placement("alloc-0000000", NODE, (0,)), fault="nowhere")  # type: ignore[arg-type]
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 0


def test_database_failure_inside_the_placement_rolls_back_and_is_wrapped(conn: Connection, fleet: DesiredState) -> None:
    """A failure raised by the database after the claim insert (the outbox write) undoes it all."""
    conn.execute("""
        CREATE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'outbox unavailable'; END $$;
        CREATE TRIGGER fail_outbox BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION fail_outbox();
    """)
    with pytest.raises(GpuaasError) as info:
        claims.place(conn, slice_placement("alloc-0000000", NODE, (0,)))
    assert not isinstance(info.value.__cause__, GpuaasError)  # wraps the psycopg error...
    assert info.value.code.startswith("db.")  # ...as a project error with a code
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 0
    assert util.slot_status(conn, NODE, 0) == "available"


def test_release_moves_claims_to_releasing_and_slots_to_cleanup(conn: Connection, fleet: DesiredState) -> None:
    p = slice_placement("alloc-0000000", NODE, (4, 5))
    conn.execute("UPDATE allocations SET gpu_count = 2 WHERE id = 'alloc-0000000'")
    assert claims.place(conn, p).placed
    r = claims.release(conn, Release("alloc-0000000", NODE, (4, 5)))
    assert (r.outcome, r.node, r.slot_indexes) == ("releasing", NODE, (4, 5))
    assert {util.slot_status(conn, NODE, i) for i in (4, 5)} == {"cleanup"}
    assert util.allocation(conn, "alloc-0000000")["status"] == "releasing"
    assert claims.release(conn, Release("alloc-0000000", NODE, (4, 5))).outcome == "unchanged"
    assert checks.run(conn) == []


def test_apply_records_pending_reasons_once(conn: Connection, fleet: DesiredState) -> None:
    plan = Plan(pending=(Pending("alloc-0000003", "plan.sku_unavailable.capacity", "no free GPU"),))
    first = claims.apply(conn, plan)
    second = claims.apply(conn, plan)
    assert first.pending[0].changed and not second.pending[0].changed
    assert not second.changed
    assert util.allocation(conn, "alloc-0000003")["pending_code"] == "plan.sku_unavailable.capacity"


def test_host_plan_generation_moves_only_when_the_spec_changes(conn: Connection, fleet: DesiredState) -> None:
    first = hostplans.write_one(conn, NODE)
    assert first is not None and first.changed and first.generation == 1
    again = hostplans.write_one(conn, NODE)
    assert again is not None and not again.changed and again.generation == 1
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (1,))).placed
    bumped = hostplans.write_one(conn, NODE)
    assert bumped is not None and bumped.changed and bumped.generation == 2
    plan = hostplans.read(conn, NODE)
    assert plan is not None and plan.generation == 2
    (vm,) = plan.vms
    assert vm.allocation_id == "alloc-0000000" and vm.vcpu_count == 24 and vm.memory_mib == 65536
    assert vm.bundles[0].slot_index == 1 and vm.image is not None and vm.image.digest_sha256
    assert len(plan.slots) == 8 and plan.releases == ()
    # The snapshot wins over later edits of the slot map: the running VM keeps its bundle.
    conn.execute("UPDATE node_resource_slots SET mac_address = '52:54:ff:ff:ff:ff' WHERE slot_index = 1")
    plan2 = hostplans.build(conn, NODE)
    assert plan2 is not None and plan2.vms[0].bundles[0].mac_address != "52:54:ff:ff:ff:ff"


def test_psycopg_errors_never_leak(conn: Connection, fleet: DesiredState) -> None:
    with pytest.raises(GpuaasError) as info, dberrors.wrapped("bad query"):
        conn.execute("SELECT * FROM no_such_table")
    assert info.value.code == "db.error"


# ---------------------------------------------------------------- many placements per round trip


def _fail_claims_of(conn: Connection, allocation: str, errcode: str, constraint: str) -> None:
    """A claim insert of `allocation` fails the way a guard would, with that SQLSTATE and constraint name."""
    conn.execute(
        f"""
        CREATE FUNCTION fail_claim() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.allocation_id = '{allocation}' THEN
                RAISE EXCEPTION 'injected refusal' USING ERRCODE = '{errcode}', CONSTRAINT = '{constraint}';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER fail_claim BEFORE INSERT ON allocation_resource_claims
            FOR EACH ROW EXECUTE FUNCTION fail_claim();
    """.encode()
    )


def test_place_many_commits_each_placement_on_its_own_in_order(
    conn: Connection, fleet: DesiredState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claims, "BATCH", 5)  # 12 placements: three round trips
    todo = [slice_placement(f"alloc-{i:07d}", f"node-{i // 8:05d}", (i % 8,)) for i in range(12)]
    results = claims.place_many(conn, todo, revision="rev1")
    assert [r.allocation_id for r in results] == [p.allocation_id for p in todo]
    assert all(r.placed and len(r.claim_ids) == 1 for r in results)
    assert util.count(conn, "SELECT count(DISTINCT xmin::text) FROM allocation_resource_claims") == 12
    assert util.count(conn, "SELECT count(*) FROM outbox WHERE event_type = 'provisioning.requested'") == 12
    assert checks.run(conn) == []
    assert claims.place_many(conn, []) == []


def test_place_many_takes_the_next_candidate_and_reports_each_attempt(conn: Connection, fleet: DesiredState) -> None:
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (0,))).placed
    results = claims.place_many(
        conn,
        [
            slice_placement("alloc-0000001", NODE, (0,), Candidate(NODE, (0,)), Candidate(NODE, (1,))),
            slice_placement("alloc-0000002", NODE, (1,), Candidate(NODE, (2,))),
            slice_placement("alloc-0000000", NODE, (3,)),
        ],
    )
    first, second, third = results
    assert first.placed and first.slot_indexes == (1,) and first.conflicts == 1  # duplicate candidate dropped
    assert second.placed and second.slot_indexes == (2,) and second.conflicts == 1
    assert third.outcome is claims.Outcome.NOT_PENDING
    assert checks.run(conn) == []


def test_place_many_goes_on_after_a_lost_race_the_database_raised(conn: Connection, fleet: DesiredState) -> None:
    _fail_claims_of(conn, "alloc-0000001", "23505", "claims_one_live_per_slot")
    results = claims.place_many(
        conn,
        [
            slice_placement("alloc-0000000", NODE, (0,)),
            slice_placement("alloc-0000001", NODE, (1,), Candidate(NODE, (2,))),
            slice_placement("alloc-0000002", NODE, (3,)),
        ],
    )
    assert [r.placed for r in results] == [True, False, True]
    lost = results[1]
    assert [a.outcome for a in lost.attempts] == [claims.Outcome.LOST_RACE] * 2
    assert lost.attempts[1].slot_indexes == (2,) and "claim.slot_taken" in (lost.attempts[1].detail or "")
    assert lost.pending_code == claims.CONFLICT_EXHAUSTED
    assert util.allocation(conn, "alloc-0000001")["pending_code"] == claims.CONFLICT_EXHAUSTED
    assert {util.slot_status(conn, NODE, i) for i in (1, 2)} == {"available"}
    assert checks.run(conn) == []


def test_place_many_stops_at_a_refusal_that_is_no_race(conn: Connection, fleet: DesiredState) -> None:
    _fail_claims_of(conn, "alloc-0000001", "23514", "claims_allocation_one_node")
    with pytest.raises(dberrors.ConstraintRefused) as info:
        claims.place_many(
            conn,
            [
                slice_placement("alloc-0000000", NODE, (0,)),
                slice_placement("alloc-0000001", NODE, (1,), Candidate(NODE, (2,))),
                slice_placement("alloc-0000002", NODE, (3,)),
            ],
        )
    assert info.value.code == "claim.allocation_other_node"
    assert util.allocation(conn, "alloc-0000000")["status"] == "reserved"  # committed before the refusal
    assert [util.allocation(conn, a)["status"] for a in ("alloc-0000001", "alloc-0000002")] == ["pending"] * 2
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 1
    assert checks.run(conn) == []
