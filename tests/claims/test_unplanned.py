"""Nodes without a host plan: a trusted sync checks only the nodes it added; a failure brings the full check back."""

from __future__ import annotations

import pytest

from reconciler.reconcile import reconciling
from reconciler.store import hostplans, inventory
from reconciler.store.connections import Connection
from schemas.errors import PermanentError
from tests.claims.conftest import small_fleet


def _planned(conn: Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT node_name FROM host_plans")}


def _present(conn: Connection) -> set[str]:
    return {str(r[0]) for r in conn.execute("SELECT name FROM nodes WHERE present")}


def test_a_node_added_while_the_plan_write_failed_gets_its_plan_on_the_next_pass(
    conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = inventory.Memory()
    reconciling.reconcile(conn, small_fleet(allocations=0, baremetal_allocations=0), memory=memory)
    assert _planned(conn) == _present(conn)
    grown = small_fleet(nodes=6, allocations=0, baremetal_allocations=0)

    def broken(*args: object, **kwargs: object) -> list[hostplans.Written]:
        raise PermanentError("the plan write failed", code="test.broken")

    with monkeypatch.context() as patched:
        patched.setattr(hostplans, "write", broken)
        with pytest.raises(PermanentError):
            reconciling.reconcile(conn, grown, memory=memory)
    assert _planned(conn) < _present(conn)  # the new nodes' rows are committed, their plans are not
    again = reconciling.reconcile(conn, grown, memory=memory)
    assert not again.sync.changes  # nothing new in git: only the doubt after the failure finds them
    assert _planned(conn) == _present(conn)


def test_a_trusted_sync_looks_only_at_the_nodes_it_added(conn: Connection) -> None:
    memory = inventory.Memory()
    reconciling.reconcile(conn, small_fleet(allocations=0, baremetal_allocations=0), memory=memory)
    conn.execute("DELETE FROM host_plans WHERE node_name = 'node-00000'")  # not something a sync could do
    grown = small_fleet(nodes=6, allocations=0, baremetal_allocations=0)
    result = reconciling.reconcile(conn, grown, memory=memory)
    assert result.sync.full is False
    added = inventory.added_nodes(result.sync.changes)
    assert added and added <= _planned(conn)
    assert "node-00000" not in _planned(conn)  # a full check (a restart, every REFRESH_EVERY syncs) finds it
    cold = reconciling.reconcile(conn, grown)
    assert cold.sync.full and "node-00000" in _planned(conn)
