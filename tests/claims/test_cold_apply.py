"""A cold apply (empty store): the collector stays off while it runs, and every node gets its plan once."""

from __future__ import annotations

import gc

from desired.state import Delta, DesiredState
from reconciler.plans import Observed, Plan
from reconciler.reconcile import reconciling
from reconciler.store.connections import Connection
from tests.claims.conftest import small_fleet


def test_a_reconciliation_runs_with_the_collector_paused_and_restores_it(conn: Connection) -> None:
    seen: list[bool] = []
    plan = reconciling.planner_for()

    def planner(desired: DesiredState, observed: Observed, delta: Delta | None = None, /) -> Plan:
        seen.append(gc.isenabled())
        return plan(desired, observed, delta)

    state = small_fleet()
    assert gc.isenabled()
    result = reconciling.reconcile(conn, state, planner=planner)
    assert seen == [False]  # rows and plans for every node are built without the collector walking them
    assert gc.isenabled()
    assert sorted(w.node for w in result.host_plans) == sorted(state.nodes)
    assert all(w.changed and w.generation == 1 for w in result.host_plans)
