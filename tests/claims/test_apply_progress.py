"""A reconciliation reports its phases to the progress display (`gpuaas apply` on a terminal, issue 34)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager

from reconciler.reconcile import reconciling
from reconciler.store.connections import Connection
from schemas import progress
from tests.claims.test_lifecycle import fleet


class Recorded(progress.Progress):
    """Keeps every phase it was handed, as it stood at the end."""

    def __init__(self) -> None:
        super().__init__(io.StringIO(), style="off")
        self.seen: list[progress.Phase] = []

    @contextmanager
    def phase(self, name: str, total: int | None = None, *, unit: str = "") -> Iterator[progress.Phase]:
        with super().phase(name, total, unit=unit) as ph:
            yield ph
        self.seen.append(ph)


def test_a_cold_reconciliation_reports_its_phases_and_counts_host_plans(conn: Connection) -> None:
    state = fleet(nodes=4, allocations=2)
    shown = Recorded()
    reconciling.reconcile(conn, state, shown=shown)
    assert [p.name for p in shown.seen] == [
        "sync inventory",
        "absorb host reports",
        "plan",
        "write claims",
        "write host plans",
    ]
    plans = shown.seen[-1]
    assert plans.total == plans.done == 4 and plans.unit == "nodes"
