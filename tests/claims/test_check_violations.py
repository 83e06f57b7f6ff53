"""`gpuaas db check` catches what the lifecycle invariants forbid (issue 15).

The constraints and triggers of migration 0011 refuse these states, so each
test corrupts a sound database by hand, as the superuser with triggers off
(`session_replication_role = replica`: what a bad restore or a manual fix
would do), and asserts that the check of that invariant names the offender.

    node A: slot s quarantined (attempt 1 failed there, claims retired and released)
    node B: the allocation's live claims (attempt 2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from reconciler.reconcile import reconciling
from reconciler.store import checks
from reconciler.store.connections import Connection
from tests.claims import util
from tests.claims.test_lifecycle import NOT_VFIO, report_vm_failure, where


@dataclass(frozen=True)
class Rescheduled:
    allocation: str
    failed_node: str
    failed_slots: tuple[int, ...]
    node: str


@pytest.fixture
def rescheduled(conn: Connection) -> Rescheduled:
    """One allocation moved off a node that failed it for good; the failed attempt fully cleaned up."""
    state: DesiredState = synthetic.fleet(nodes=3, allocations=1, baremetal_nodes=0, baremetal_allocations=0)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    first, slots = where(conn, aid)
    assert first is not None
    report_vm_failure(conn, first, slots, aid, *NOT_VFIO)
    reconciling.reconcile(conn, state)
    for s in slots:
        util.report_wipe(conn, first, s, aid)
    reconciling.reconcile(conn, state)
    second, _ = where(conn, aid)
    assert second is not None and second != first
    assert util.slot_status(conn, first, slots[0]) == "quarantined"
    assert checks.run(conn) == []  # sound before the corruption
    return Rescheduled(aid, first, slots, second)


@pytest.fixture
def untriggered(conn: Connection, rescheduled: Rescheduled) -> Iterator[Connection]:
    """The same connection with triggers (and the foreign keys they implement) off, once the state is built."""
    conn.execute("SET session_replication_role = replica")
    try:
        yield conn
    finally:
        conn.execute("SET session_replication_role = DEFAULT")


def drop_evidence(conn: Connection, r: Rescheduled) -> None:
    conn.execute(
        "UPDATE node_resource_slots SET quarantine = NULL"
        " WHERE node_id = (SELECT id FROM nodes WHERE name = %s) AND slot_index = %s",
        (r.failed_node, r.failed_slots[0]),
    )


Corruption = Callable[[Connection, Rescheduled], str]  # corrupts, returns the expected offender text


def retired_claim_live_again(conn: Connection, r: Rescheduled) -> str:
    conn.execute(
        "UPDATE allocation_resource_claims SET status = 'active'"
        " WHERE id IN (SELECT claim_id FROM retired_claims WHERE allocation_id = %s)",
        (r.allocation,),
    )
    return f"{r.allocation} {r.failed_node}:{r.failed_slots[0]} active"


def attempt_moved_to_current_node(conn: Connection, r: Rescheduled) -> str:
    conn.execute("UPDATE allocation_attempts SET node = %s WHERE allocation_id = %s", (r.node, r.allocation))
    return f"{r.allocation} {r.node}"


def retired_claims_forgotten(conn: Connection, r: Rescheduled) -> str:
    conn.execute("DELETE FROM retired_claims WHERE allocation_id = %s", (r.allocation,))
    return f"{r.allocation} #1"


def quarantine_evidence_dropped(conn: Connection, r: Rescheduled) -> str:
    drop_evidence(conn, r)
    return f"{r.failed_node}:{r.failed_slots[0]}"


def attempt_failed_for_good_but_placed(conn: Connection, r: Rescheduled) -> str:
    conn.execute("UPDATE allocation_attempts SET outcome = 'failed' WHERE allocation_id = %s", (r.allocation,))
    return f"{r.allocation} reserved"


@pytest.mark.parametrize(
    ("check", "corrupt"),
    [
        ("retired_claim_not_released", retired_claim_live_again),
        ("placed_on_failed_node", attempt_moved_to_current_node),
        ("attempt_without_retired_claims", retired_claims_forgotten),
        ("quarantine_without_evidence", quarantine_evidence_dropped),
        ("exhausted_not_failed", attempt_failed_for_good_but_placed),
    ],
)
def test_each_lifecycle_invariant_reports_its_corruption(
    untriggered: Connection, rescheduled: Rescheduled, check: str, corrupt: Corruption
) -> None:
    offender = corrupt(untriggered, rescheduled)
    found = {v.name: v for v in checks.run(untriggered)}
    assert check in found, f"{check} missed the corruption; found {sorted(found)}"
    assert found[check].count == 1 and found[check].sample == (offender,)
    assert offender in found[check].render()


def test_the_triggers_refuse_the_same_corruption_through_the_normal_path(
    conn: Connection, rescheduled: Rescheduled
) -> None:
    """Without the replica role a dropped evidence frees the slot instead: the check is the backstop, not the guard."""
    r = rescheduled
    drop_evidence(conn, r)
    assert util.slot_status(conn, r.failed_node, r.failed_slots[0]) == "available"
    assert checks.run(conn) == []
