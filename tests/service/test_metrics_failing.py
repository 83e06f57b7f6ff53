"""/metrics while reconciliation keeps failing: `gpuaas_reconciliation_failing` goes to 1 and back (issue 18)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from reconciler.store import connections, history, revisions
from tests.service.conftest import Served


def _failing(served: Served) -> tuple[float, float]:
    status, _, body = served.get("/metrics")
    assert status == 200
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if not s.labels
    }
    return values["gpuaas_reconciliation_failing"], values["gpuaas_reconciliation_failures"]


def test_failing_gauge_follows_reconciliations_that_keep_failing(served: Served, fleet_url: str) -> None:
    assert _failing(served) == (0, 0)  # the fixture's apply succeeded
    with connections.connect(fleet_url, autocommit=True) as conn:
        for _ in range(2):  # a loop retrying one revision that the database keeps refusing
            run = history.start(conn, revision="bbbb", source="apply test")
            history.finish(conn, run, result="error", problems=[{"code": "db.error", "message": "it broke"}])
        assert _failing(served) == (1, 2)
        # An invalid revision is the author's problem, not a failing loop: nothing changes.
        invalid = history.start(conn, revision="cccc", source="apply test")
        history.finish(conn, invalid, result="error", counts={revisions.INVALID_COUNT: 1}, problems=[])
        assert _failing(served) == (1, 2)
        good = history.start(conn, revision="dddd", source="apply test")
        history.finish(conn, good, result="unchanged")
    assert _failing(served) == (0, 0)
