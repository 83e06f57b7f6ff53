"""The database refuses double claims by itself, each guard on its own and under concurrency.

Every test hand-makes claims with plain INSERTs (no apply code involved). To
prove one guard, the others are switched off in the test's throwaway
database: a constraint that only works because a trigger caught the case
first would prove nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from desired.state import DesiredState
from reconciler.store import connections
from reconciler.store.connections import Connection
from schemas import dberrors
from tests.claims import util

A0, A1, A2 = "alloc-0000000", "alloc-0000001", "alloc-0000002"
BM0 = "alloc-0000024"  # first baremetal allocation of the small fleet
NODE = "node-00000"

NO_TRIGGER = "ALTER TABLE allocation_resource_claims DISABLE TRIGGER claims_guard_insert"
NO_UNIQUE = "DROP INDEX claims_one_live_per_slot"
NO_EXCLUSION = "ALTER TABLE allocation_resource_claims DROP CONSTRAINT claims_node_exclusive"


def _refused(conn: Connection, action: Callable[[], object]) -> dberrors.ConstraintRefused:
    with pytest.raises(psycopg.Error) as info:
        action()
    err = dberrors.translate(info.value, "hand-made claim")
    assert isinstance(err, dberrors.ConstraintRefused), err
    return err


def _only(conn: Connection, *statements: str) -> None:
    for stmt in statements:
        conn.execute(stmt.encode())


# ---------------------------------------------------------------- each guard alone


def test_unique_index_alone_refuses_two_live_claims_on_one_slot(conn: Connection, fleet: DesiredState) -> None:
    _only(conn, NO_TRIGGER, NO_EXCLUSION)
    util.insert_slot_claim(conn, A0, NODE, 3)
    err = _refused(conn, lambda: util.insert_slot_claim(conn, A1, NODE, 3))
    assert err.constraint == "claims_one_live_per_slot"
    assert err.code == "claim.slot_taken"


def test_exclusion_alone_refuses_two_live_claims_on_one_slot(conn: Connection, fleet: DesiredState) -> None:
    _only(conn, NO_TRIGGER, NO_UNIQUE)
    util.insert_slot_claim(conn, A0, NODE, 3)
    err = _refused(conn, lambda: util.insert_slot_claim(conn, A1, NODE, 3))
    assert err.constraint == "claims_node_exclusive"


def test_exclusion_refuses_slot_claim_on_a_node_held_exclusively(conn: Connection, fleet: DesiredState) -> None:
    _only(conn, NO_TRIGGER, NO_UNIQUE)
    util.insert_node_claim(conn, BM0, NODE)
    err = _refused(conn, lambda: util.insert_slot_claim(conn, A0, NODE, 5))
    assert (err.constraint, err.code) == ("claims_node_exclusive", "claim.node_overlap")


def test_exclusion_refuses_exclusive_claim_on_a_node_with_a_slot_claim(conn: Connection, fleet: DesiredState) -> None:
    _only(conn, NO_TRIGGER, NO_UNIQUE)
    util.insert_slot_claim(conn, A0, NODE, 5)
    err = _refused(conn, lambda: util.insert_node_claim(conn, BM0, NODE))
    assert err.constraint == "claims_node_exclusive"


def test_exclusion_refuses_two_exclusive_claims(conn: Connection, fleet: DesiredState) -> None:
    _only(conn, NO_TRIGGER, NO_UNIQUE)
    util.insert_node_claim(conn, BM0, NODE)
    err = _refused(conn, lambda: util.insert_node_claim(conn, "alloc-0000025", NODE))
    assert err.constraint == "claims_node_exclusive"


def test_slot_claims_on_different_slots_coexist(conn: Connection, fleet: DesiredState) -> None:
    for i, alloc in enumerate((A0, A1, A2)):
        util.insert_slot_claim(conn, alloc, NODE, i)
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 3


def test_released_claims_do_not_count(conn: Connection, fleet: DesiredState) -> None:
    """Only live claims take part; a released one is history (inserted raw, guards off)."""
    _only(conn, NO_TRIGGER, "ALTER TABLE allocation_resource_claims DISABLE TRIGGER claims_guard_update")
    util.insert_slot_claim(conn, A0, NODE, 1)
    conn.execute("UPDATE allocation_resource_claims SET status = 'released'")
    util.insert_slot_claim(conn, A1, NODE, 1)
    util.insert_node_claim(conn, BM0, "node-00001")


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (
            "UPDATE node_resource_slots SET status = 'disabled', present = false WHERE slot_index = 2",
            "claim.slot_not_claimable",
        ),
        ("UPDATE node_resource_slots SET status = 'cleanup_blocked' WHERE slot_index = 2", "claim.slot_not_claimable"),
        (
            "UPDATE node_resource_slots SET eligible = false, ineligible_reasons = '{slot.vf_shared}'"
            " WHERE slot_index = 2",
            "claim.slot_not_claimable",
        ),
        ("UPDATE nodes SET admin_state = 'draining'", "claim.node_not_claimable"),
        ("UPDATE nodes SET present = false", "claim.node_not_claimable"),
        ("UPDATE allocations SET status = 'released'", "claim.allocation_not_pending"),
    ],
)
def test_trigger_refuses_unclaimable_targets(conn: Connection, fleet: DesiredState, setup: str, code: str) -> None:
    _only(conn, "ALTER TABLE node_resource_slots DISABLE TRIGGER slots_guard_status", setup)
    err = _refused(conn, lambda: util.insert_slot_claim(conn, A0, NODE, 2))
    assert err.code == code


def test_trigger_refuses_claims_of_one_allocation_on_two_nodes(conn: Connection, fleet: DesiredState) -> None:
    util.insert_slot_claim(conn, A0, NODE, 0)
    err = _refused(conn, lambda: util.insert_slot_claim(conn, A0, "node-00001", 0))
    assert err.code == "claim.allocation_other_node"


def test_claims_are_never_deleted_and_statuses_only_move_forward(conn: Connection, fleet: DesiredState) -> None:
    util.insert_slot_claim(conn, A0, NODE, 0)
    err = _refused(conn, lambda: conn.execute("DELETE FROM allocation_resource_claims"))
    assert err.code == "claim.no_delete"
    conn.execute("UPDATE allocation_resource_claims SET status = 'active'")
    err = _refused(conn, lambda: conn.execute("UPDATE allocation_resource_claims SET status = 'reserved'"))
    assert err.code == "claim.bad_transition"
    err = _refused(
        conn, lambda: conn.execute("UPDATE allocation_resource_claims SET resource_snapshot = '{\"gpus\": 2}'")
    )
    assert err.code == "claim.immutable"


def test_a_claim_leaves_the_live_set_only_with_wipe_proof(conn: Connection, fleet: DesiredState) -> None:
    util.insert_slot_claim(conn, A0, NODE, 0)
    conn.execute("UPDATE allocation_resource_claims SET status = 'releasing'")
    err = _refused(conn, lambda: conn.execute("UPDATE allocation_resource_claims SET status = 'released'"))
    assert err.code == "claim.release_needs_proof"
    util.report_wipe(conn, NODE, 0, A0)
    conn.execute("UPDATE allocation_resource_claims SET status = 'released'")


def test_a_slot_cannot_look_free_under_a_live_claim(conn: Connection, fleet: DesiredState) -> None:
    util.insert_slot_claim(conn, A0, NODE, 0)
    conn.execute(
        "UPDATE node_resource_slots SET status = 'reserved' WHERE slot_index = 0"
        " AND node_id = (SELECT id FROM nodes WHERE name = %s)",
        (NODE,),
    )
    err = _refused(
        conn, lambda: conn.execute("UPDATE node_resource_slots SET status = 'available' WHERE status = 'reserved'")
    )
    assert err.code == "slot.free_with_live_claim"
    err = _refused(
        conn,
        lambda: conn.execute(
            "UPDATE node_resource_slots SET status = 'active' WHERE status = 'available' AND slot_index = 5"
        ),
    )
    assert err.code == "slot.claimed_without_claim"


# ---------------------------------------------------------------- racing transactions


def _race(
    db_url: str, first: Callable[[Connection], None], second: Callable[[Connection], None]
) -> psycopg.Error | None:
    """T1 runs `first` and holds its transaction open; T2 runs `second` and must block until T1 commits."""
    t1 = connections.connect(db_url)
    t2 = connections.connect(db_url)
    outcome: list[psycopg.Error | None] = []

    def run_second() -> None:
        try:
            second(t2)
            t2.commit()
            outcome.append(None)
        except psycopg.Error as e:
            t2.rollback()
            outcome.append(e)

    try:
        first(t1)
        worker = threading.Thread(target=run_second)
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive(), "the second transaction did not wait for the first"
        t1.commit()
        worker.join(timeout=30)
        assert not worker.is_alive()
    finally:
        t1.close()
        t2.close()
    return outcome[0]


@pytest.mark.parametrize("guards", ["exclusion only", "all guards"])
@pytest.mark.parametrize("order", ["exclusive first", "slot first"])
def test_exclusive_and_slot_claims_race_in_both_orders(
    db_url: str, conn: Connection, fleet: DesiredState, guards: str, order: str
) -> None:
    if guards == "exclusion only":
        _only(conn, NO_TRIGGER, NO_UNIQUE)

    def exclusive(c: Connection) -> None:
        util.insert_node_claim(c, BM0, NODE)

    def slot(c: Connection) -> None:
        util.insert_slot_claim(c, A0, NODE, 6)

    first, second = (exclusive, slot) if order == "exclusive first" else (slot, exclusive)
    err = _race(db_url, first, second)
    assert err is not None, "both claims committed"
    refused = dberrors.translate(err, "racing claim")
    assert refused.code in ("claim.node_overlap", "claim.node_not_claimable"), refused
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 1


@pytest.mark.parametrize("guards", ["unique index only", "all guards"])
def test_two_claims_race_for_one_slot(db_url: str, conn: Connection, fleet: DesiredState, guards: str) -> None:
    if guards == "unique index only":
        _only(conn, NO_TRIGGER, NO_EXCLUSION)
    err = _race(
        db_url, lambda c: util.insert_slot_claim(c, A0, NODE, 7), lambda c: util.insert_slot_claim(c, A1, NODE, 7)
    )
    assert err is not None
    assert dberrors.translate(err, "racing claim").code == "claim.slot_taken"
    assert util.count(conn, "SELECT count(*) FROM allocation_resource_claims") == 1
