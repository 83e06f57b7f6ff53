"""The loop re-converges when the store moves under it, and says so when git moves back (issue 26).

- a file-level style restore (pg_dump at the older commit, pg_restore after
  the newer one was applied), another writer applying an ancestor, and a
  truncated history: the next retry tick (one interval) applies the revision
  in force again, from nothing; the allocation placed at HEAD is placed again;
- a database that lost its schema is migrated (or, told not to migrate,
  `gpuaas run` exits 4 with `gitops.no_schema`), never a retry forever;
- a force-push of the branch to an older commit is refused, recorded once in
  the history (`gitops.head_behind`) and shown in the store's health.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from desired.state import DesiredState
from reconciler import cli, sources
from reconciler.loop import watching
from reconciler.reconcile import reconciling
from reconciler.store import connections, history, revisions
from tests.gitops.conftest import LoopRun, Repo, claims, history_rows

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _state_at(repo: Repo, rev: str) -> DesiredState:
    loaded = sources.load(repo.root, rev)
    assert not loaded.errors
    return loaded.state


def _applied_twice(fleet_repo: Repo, loop: LoopRun) -> tuple[str, str]:
    first = loop.step()
    assert first is not None and first.kind == "applied" and first.revision is not None
    head = fleet_repo.request("req-head", 2)
    event = loop.step()
    assert event is not None and event.kind == "applied" and event.revision == head
    return first.revision, head


def _tick(loop: LoopRun) -> watching.Event | None:
    loop.loop.next_retry = loop.loop.not_before = 0.0  # one interval later (the clock is not what is tested)
    return loop.step()


def test_a_restore_from_an_older_backup_is_brought_back_to_head(
    fleet_repo: Repo, loop: LoopRun, db_url: str, conn: connections.Connection, tmp_path: Path
) -> None:
    first = loop.step()
    assert first is not None and first.kind == "applied"
    backup = tmp_path / "at-base.dump"
    subprocess.run([str(PG_BIN / "pg_dump"), "-Fc", "-f", str(backup), "-d", db_url], check=True, timeout=120)
    head = fleet_repo.request("req-head", 2)
    applied = loop.step()
    assert applied is not None and applied.revision == head and len(claims(conn, "req-head")) == 2
    subprocess.run(
        [str(PG_BIN / "pg_restore"), "--clean", "--if-exists", "--single-transaction", "-d", db_url, str(backup)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    assert claims(conn, "req-head") == [] and revisions.latest_applied(conn) == first.revision  # the old store
    event = _tick(loop)  # one tick: no error first (the restored tables make the old session's plans stale)
    assert event is not None and event.kind == "applied" and "gitops.reconverged" in event.message, event
    assert revisions.latest_applied(conn) == head
    assert len(claims(conn, "req-head")) == 2  # its GPUs are not free any more


def test_another_writer_applying_an_ancestor_is_undone_within_one_interval(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    base, head = _applied_twice(fleet_repo, loop)
    reconciling.reconcile(conn, _state_at(fleet_repo, base), source="apply")  # `gpuaas apply --rev base`
    assert revisions.latest_applied(conn) == base
    event = _tick(loop)
    assert event is not None and event.kind == "applied" and event.revision == head
    assert "gitops.reconverged" in event.message and base[:12] in event.message
    assert revisions.latest_applied(conn) == head
    assert history.health(conn).head_applied


def test_a_truncated_history_is_applied_again(fleet_repo: Repo, loop: LoopRun, conn: connections.Connection) -> None:
    _base, head = _applied_twice(fleet_repo, loop)
    conn.execute("TRUNCATE reconciliations")
    event = _tick(loop)
    assert event is not None and event.kind == "applied" and "gitops.reconverged" in event.message
    assert revisions.latest_applied(conn) == head


def test_a_newer_revision_applied_elsewhere_is_left_alone(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    """Another reconciler is ahead (a commit this clone has not fetched): never rolled back from here."""
    _base, head = _applied_twice(fleet_repo, loop)
    conn.execute("UPDATE reconciliations SET revision = %s WHERE revision = %s", ("f" * 40, head))
    assert _tick(loop) is None
    assert revisions.latest_applied(conn) == "f" * 40


def test_a_database_that_lost_its_schema_is_migrated_and_brought_back(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    _base, head = _applied_twice(fleet_repo, loop)
    conn.execute("DROP SCHEMA public CASCADE")
    conn.execute("CREATE SCHEMA public")
    events = [_tick(loop) for _ in range(3)]
    kinds = [e.kind if e else None for e in events]
    assert "migrated" in kinds, [e.render() for e in events if e]
    assert revisions.latest_applied(conn) == head
    assert len(claims(conn, "req-head")) == 2
    assert not [e for e in loop.events if e.kind == "error"], [e.render() for e in loop.events]


def test_told_not_to_migrate_the_loop_stops_with_a_code(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    _applied_twice(fleet_repo, loop)
    loop.loop.migrate = False
    conn.execute("DROP SCHEMA public CASCADE")
    conn.execute("CREATE SCHEMA public")
    event = _tick(loop)
    assert event is not None and "gitops.no_schema" in event.message
    assert loop.loop.no_schema and loop.loop.run() is None  # run() returns at once: nothing retried


def test_run_no_migrate_exits_4_on_an_empty_database(fleet_repo: Repo, empty_db_url: str) -> None:
    from tests.gitops.test_run_command import _env, _gpuaas

    done = subprocess.run(
        _gpuaas("run", str(fleet_repo.root), "--once", "--no-migrate", "--db-url", empty_db_url),
        env=_env(),
        timeout=120,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 4, done
    assert "gitops.no_schema" in done.stdout + done.stderr


def test_a_force_push_to_an_older_commit_is_recorded_and_shown(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base, head = _applied_twice(fleet_repo, loop)
    fleet_repo.repo.git.reset("--hard", base)  # the branch moved back (force-push, rollback)
    event = loop.step()
    assert event is not None and event.kind == "behind" and "gitops.head_behind" in event.message
    rows = [r for r in history_rows(conn) if r[0] == base]
    assert rows[-1][2] == "error"
    health = history.health(conn)
    assert health.last_applied_revision == head  # the applied revision stays in force
    assert health.head is not None and health.head.revision == base and not health.head.applied
    assert health.head.code == "gitops.head_behind" and health.head.since is not None
    assert not health.failing  # a refusal, not a failure
    before = len(history_rows(conn))
    loop.loop.seen = None  # seen afresh (a restarted loop, a second reconciler): recorded once all the same
    again = loop.step()
    assert again is not None and again.kind == "behind" and again.run_id is None
    assert len(history_rows(conn)) == before
    assert len(claims(conn, "req-head")) == 2  # nothing was synced from the older revision
    for argv in (["status"], ["history"]):  # shown where operators look, not only in the log
        assert cli.main([*argv, "--db-url", db_url]) == 0
        out = capsys.readouterr().out
        assert "gitops.head_behind" in out and base[:12] in out, out


def test_an_invalid_head_is_not_applied_and_says_since_when(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    loop.step()
    fleet_repo.write("allocations/zz-broken.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: [\n")
    bad = fleet_repo.commit("a broken allocation file")
    event = loop.step()
    assert event is not None and event.kind == "invalid"
    health = history.health(conn)
    assert health.head is not None and health.head.revision == bad and not health.head.applied
    assert health.head.since is not None and health.head.code is not None
    assert not health.failing  # what `gpuaas_reconciliation_failing` says: nothing is failing, HEAD is refused
