"""A revision read whole: its cross-file rules run while the inventory sync waits, and decide its commit.

`reconciler.loop.beside`: the sync writes its rows in a transaction that
commits only once the rules pass; a tree that breaks one is refused as
before (one history row with every problem) and leaves no row behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from desired.state import LoadResult
from reconciler import sources
from reconciler.loop import beside
from reconciler.store import connections, revisions
from tests.gitops.conftest import LoopRun, Repo

NODE = "h200-use1-s01"


def _count(conn: connections.Connection, table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # noqa: S608 - the tests' own table names
    return int(row[0]) if row else 0


def _watch_rules(monkeypatch: pytest.MonkeyPatch, run: LoopRun) -> dict[str, object]:
    """Where the rules ran, and how many node rows the sync's open transaction held when they were asked."""
    seen: dict[str, object] = {}
    real_checked, real_rules = sources.checked, beside.rules

    def checked(parsed: LoadResult, check: sources.Check | None = None) -> LoadResult:
        seen["thread"] = threading.current_thread().name
        return real_checked(parsed, check)

    @contextmanager
    def rules(parsed: LoadResult, check: sources.Check) -> Iterator[Callable[[], LoadResult]]:
        with real_rules(parsed, check) as passed:

            def asked() -> LoadResult:
                assert run.loop.conn is not None
                seen["nodes_in_transaction"] = _count(run.loop.conn, "nodes")
                return passed()

            yield asked

    monkeypatch.setattr(sources, "checked", checked)
    monkeypatch.setattr(beside, "rules", rules)
    return seen


def test_a_first_revision_that_breaks_a_rule_is_refused_and_its_rows_rolled_back(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet_repo.edit(f"nodes/{NODE}.yaml", "region: us-east-1", "region: mars-north-1")
    bad = fleet_repo.commit("a node in a region the Fleet does not declare")
    seen = _watch_rules(monkeypatch, loop)
    generation = conn.execute("SELECT generation FROM inventory_generation").fetchone()
    event = loop.step()
    assert event is not None and event.kind == "invalid", event
    assert "1 validation error(s), first:" in event.message and f"nodes/{NODE}.yaml:" in event.message
    assert "mars-north-1" in event.message
    assert seen["thread"].startswith("gpuaas-rules")  # type: ignore[union-attr]
    assert seen["nodes_in_transaction"] == 2  # the sync had written its rows when the rules were asked ...
    for table in ("nodes", "node_resource_slots", "sku_catalog", "desired_revisions", "host_plans"):
        assert _count(conn, table) == 0, table  # ... and none of them stayed
    assert conn.execute("SELECT generation FROM inventory_generation").fetchone() == generation
    rows = conn.execute("SELECT result, counts, errors FROM reconciliations WHERE revision = %s", (bad,)).fetchall()
    assert len(rows) == 1  # recorded once, as a tree refused for its YAML is
    result, counts, errors = rows[0]
    assert result == "error" and counts == {revisions.INVALID_COUNT: 1}
    assert [(e["code"], e["file"]) for e in errors] == [("desired.ref.unresolved", f"nodes/{NODE}.yaml")]
    assert errors[0]["line"] >= 1 and "mars-north-1" in errors[0]["text"]
    assert revisions.refused_by(conn, bad) is not None
    assert loop.step() is None  # refused once, not again every tick
    assert loop.loop.state is None and revisions.latest_applied(conn) is None


def test_a_valid_first_revision_commits_once_the_rules_pass(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _watch_rules(monkeypatch, loop)
    event = loop.step()
    assert event is not None and event.kind == "applied", event
    assert seen["thread"].startswith("gpuaas-rules") and seen["nodes_in_transaction"] == 2  # type: ignore[union-attr]
    assert _count(conn, "nodes") == 2 and _count(conn, "host_plans") == 2
    assert revisions.latest_applied(conn) == fleet_repo.repo.head.commit.hexsha
    # a later commit is read by delta: its rules run here, before the sync, as they always did
    seen.clear()
    fleet_repo.edit(f"nodes/{NODE}.yaml", "region: us-east-1", "region: mars-north-1")
    fleet_repo.commit("a node in a region the Fleet does not declare")
    event = loop.step()
    assert event is not None and event.kind == "invalid" and "mars-north-1" in event.message
    assert seen["thread"] == threading.current_thread().name and "nodes_in_transaction" not in seen
    assert conn.execute("SELECT region FROM nodes WHERE name = %s", (NODE,)).fetchone() == ("us-east-1",)
