"""The reconciler loop on a real git repo and a real PostgreSQL: one step per commit."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import git
import pytest

from reconciler.loop import heads, watching
from reconciler.store import connections, revisions
from tests.gitops.conftest import (
    LoopRun,
    Repo,
    allocation_status,
    claims,
    history_rows,
    make_loop,
    prove_wipe,
    slot_statuses,
)


def test_bot_request_commit_is_placed_within_one_iteration(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    first = loop.step()
    assert first is not None and first.kind == "applied"
    sha = fleet_repo.request("req-one", 2)
    event = loop.step()
    assert event is not None and event.kind == "applied" and event.revision == sha
    assert event.counts["placed"] == 1
    placed = claims(conn, "req-one")
    assert len(placed) == 2 and {s for _, _, s in placed} == {"reserved"}
    assert allocation_status(conn, "req-one") == ("reserved", None)
    assert loop.step() is None  # nothing new, nothing due: no reconciliation, no history row
    assert [r[1].split()[0] for r in history_rows(conn)] == ["apply", "apply"]


def test_release_moves_slots_to_cleanup_and_wipe_proof_frees_them(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    fleet_repo.request("req-rel", 1)
    loop.step()
    ((node, idx, _),) = claims(conn, "req-rel")
    assert idx is not None
    fleet_repo.release("req-rel")
    event = loop.step()
    assert event is not None and event.counts["releasing"] == 1
    assert claims(conn, "req-rel") == [(node, idx, "releasing")]
    assert slot_statuses(conn, node)[idx] == "cleanup"
    assert allocation_status(conn, "req-rel")[0] == "releasing"
    # the host proves the wipe; the next retry tick frees the slot (no new commit needed)
    assert prove_wipe(conn, "req-rel") == 1
    loop.loop.next_retry = 0.0
    retried = loop.step()
    assert retried is not None and retried.kind == "retried" and retried.counts["slots_freed"] == 1
    assert slot_statuses(conn, node)[idx] == "available"
    assert allocation_status(conn, "req-rel")[0] == "released"


def test_pending_allocation_is_retried_when_capacity_frees(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    fleet_repo.request("req-big-1", 8)
    fleet_repo.request("req-big-2", 8)
    fleet_repo.request("req-waits", 8)
    loop.step()
    assert allocation_status(conn, "req-waits") == ("pending", "plan.sku_unavailable.capacity")
    loop.loop.next_retry = 0.0
    assert loop.step() is None  # the pure plan still places nothing: no reconciliation recorded
    fleet_repo.release("req-big-1")
    loop.step()
    assert allocation_status(conn, "req-waits")[0] == "pending"  # slots wait in cleanup
    prove_wipe(conn, "req-big-1")
    loop.loop.next_retry = 0.0
    event = loop.step()
    assert event is not None and event.kind == "retried" and event.counts["placed"] == 1
    assert allocation_status(conn, "req-waits")[0] == "reserved"


def test_invalid_revision_is_recorded_with_file_line_and_last_valid_stays(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    loop.step()
    fleet_repo.write(
        "allocations/broken.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: req-broken\ngpu_count: two\n"
    )
    bad = fleet_repo.commit("a broken request")
    event = loop.step()
    assert event is not None and event.kind == "invalid" and "allocations/broken.yaml:" in event.message
    row = conn.execute("SELECT result, errors FROM reconciliations WHERE revision = %s", (bad,)).fetchone()
    assert row is not None and row[0] == "error"
    assert any(e["file"] == "allocations/broken.yaml" and e["line"] >= 1 for e in row[1])
    assert loop.step() is None  # refused once, not again every tick
    assert revisions.latest_applied(conn) != bad


def test_second_reconciler_does_not_apply_a_revision_twice(
    fleet_repo: Repo, db_url: str, conn: connections.Connection
) -> None:
    sha = fleet_repo.request("req-twice", 1)
    a, b = make_loop(fleet_repo, db_url), make_loop(fleet_repo, db_url)
    try:
        # B finds A applying the revision right now (A holds the revision's lock) ...
        with revisions.try_lock(conn, sha) as held:
            assert held
            busy = b.step()
        assert busy is not None and busy.kind == "skipped" and "another reconciler" in busy.message
        applied = a.step()
        assert applied is not None and applied.kind == "applied"
        # ... and, once A is done, sees it in the history and leaves it alone.
        b.loop.not_before = 0.0
        skipped = b.step()
        assert skipped is not None and skipped.kind == "skipped" and "already applied" in skipped.message
    finally:
        for run in (a, b):
            run.loop.close()
            run.loop.source.close()
    applies = [r for r in history_rows(conn) if r[0] == sha and r[1].startswith("apply")]
    assert len(applies) == 1
    events = conn.execute(
        "SELECT count(*) FROM outbox WHERE event_type = 'provisioning.requested' AND aggregate_id = 'req-twice'"
    ).fetchone()
    assert events == (1,)


def test_stale_clone_does_not_roll_the_fleet_back(
    fleet_repo: Repo, loop: LoopRun, db_url: str, conn: connections.Connection
) -> None:
    old = fleet_repo.request("req-old", 1)
    new = fleet_repo.request("req-new", 1)
    loop.step()  # applies `new`
    fleet_repo.repo.git.checkout(old)  # a second checkout that lags behind
    stale = make_loop(fleet_repo, db_url)
    try:
        event = stale.step()
        assert event is not None and event.kind == "behind" and new[:12] in event.message
    finally:
        stale.loop.close()
    assert claims(conn, "req-new")  # still placed: nothing was synced from the older revision


def test_sigterm_during_a_reconciliation_finishes_it_and_stops(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal lands while the plan is being applied: the transaction completes, then the loop returns."""
    import os
    import signal

    from reconciler.commands import run as run_cmd
    from reconciler.placement import replanning

    fleet_repo.request("req-sig", 1)
    real = replanning.WarmPlanner.__call__  # the loop plans with its kept engine

    def plan_then_signal(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(replanning.WarmPlanner, "__call__", plan_then_signal)
    run = make_loop(fleet_repo, db_url)
    with run_cmd.stop_on_signals(run.stop):
        last = run.loop.run()
    run.loop.source.close()
    assert run.stop.is_set()
    assert last is not None and last.kind == "applied"
    assert claims(conn, "req-sig") and allocation_status(conn, "req-sig")[0] == "reserved"
    assert [r[2] for r in history_rows(conn)] == ["changed"]


def test_the_loops_session_never_compiles_a_statement(loop: LoopRun) -> None:
    """JIT compiled some per-commit statements on every execution at 100,000 nodes (tens of ms each)."""
    row = loop.loop._conn().execute("SHOW jit").fetchone()
    assert row is not None and row[0] == "off"


def test_the_periodic_full_comparison_runs_while_idle_not_on_a_commit(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every REFRESH_EVERY syncs every inventory row is compared again (10 s at 10,000 nodes), and every
    full_every plans the placement engine is built cold (6 s): when the loop is idle, not on a commit.
    The comparison puts back a row changed behind the memory's back."""
    from reconciler.loop import heaps
    from reconciler.store import inventory

    monkeypatch.setattr(inventory.Memory, "REFRESH_EVERY", 2)
    now = [0.0]
    stop = threading.Event()
    loop = watching.Loop(
        fleet_repo.root,
        heads.LocalHead(fleet_repo.root, stop),
        lambda: connections.connect(db_url, autocommit=True),
        stop=stop,
        interval=3600.0,
        clock=lambda: now[0],
    )
    loop.plans.full_every = 3
    try:
        assert loop.step() is not None  # the cold apply: every row compared
        conn.execute("UPDATE nodes SET pool = 'tampered' WHERE name = 'h200-use1-s01'")  # no generation bump
        for name in ("req-idle-1", "req-idle-2"):
            fleet_repo.request(name, 1)
            event = loop.step()
            assert event is not None and event.kind == "applied"
        full, cold = loop.inventory.full_syncs, loop.plans.cold
        assert loop.inventory.refresh_due() and full == 1  # due, yet neither commit paid for it
        assert loop.plans.rebuild_due() and cold == 1
        now[0] += heaps.IDLE_S / 2
        assert loop.step() is None  # a commit may still be on its way
        now[0] += heaps.IDLE_S
        event = loop.step()
        assert event is not None and event.kind == "retried"
        assert event.message == "every inventory row compared and placement engine built cold while idle"
        assert loop.inventory.full_syncs == full + 1 and not loop.inventory.refresh_due()
        assert loop.plans.cold == cold + 1 and not loop.plans.rebuild_due()
        row = conn.execute("SELECT pool FROM nodes WHERE name = 'h200-use1-s01'").fetchone()
        assert row is not None and row[0] == "h200-slice"
    finally:
        loop.close()
        loop.source.close()


def test_local_head_wakes_on_commit(fleet_repo: Repo) -> None:
    stop = threading.Event()
    source = heads.LocalHead(fleet_repo.root, stop, debounce_ms=50, step_ms=10, tick_s=60.0)
    try:
        before = source.current()
        timer = threading.Timer(0.3, lambda: fleet_repo.request("req-wake", 1))
        timer.start()
        t0 = time.monotonic()
        source.wait(120.0)  # returns on the ref update, long before the 60 s tick
        timer.join()
        assert time.monotonic() - t0 < 30.0  # loose: a commit alone takes seconds at load 10 on 2 cores
        assert source.current() != before
    finally:
        source.close()


def test_local_head_never_sees_objects_being_written(fleet_repo: Repo) -> None:
    """A `git gc` on a large repo deletes its loose objects by the hundred thousand: when the whole git
    directory was watched, sorting out those events held a commit back for 25 s at 100,000 nodes."""
    stop = threading.Event()
    source = heads.LocalHead(fleet_repo.root, stop, debounce_ms=50, step_ms=10, tick_s=60.0)
    seen: list[str] = []
    wanted = source._wanted
    source._wanted = lambda change, path: seen.append(path) or wanted(change, path)  # type: ignore[method-assign]
    objects = Path(fleet_repo.repo.git_dir) / "objects" / "ee"
    objects.mkdir(exist_ok=True)

    def flood_then_commit() -> None:
        for i in range(200):
            (objects / f"{i:038x}").write_bytes(b"x")
        fleet_repo.request("req-flood", 1)

    try:
        source.wait(0.05)  # the watcher is set up (returns at the short first tick)
        before = source.current()
        timer = threading.Timer(0.3, flood_then_commit)
        timer.start()
        deadline = time.monotonic() + 60.0  # loose: a commit alone takes seconds at load 10 on 2 cores
        while source.current() == before and time.monotonic() < deadline:
            source.wait(120.0)  # returns on a wake or at the 50 ms tick the first wait set
        timer.join()
        assert source.current() != before
        assert seen and not [p for p in seen if "/objects/" in p]
        git_dir = Path(fleet_repo.repo.git_dir).resolve()
        assert source.watched == (git_dir, git_dir / "refs" / "heads")
    finally:
        source.close()
        for f in objects.glob("*"):
            f.unlink()


def test_local_head_ancestry_from_parents_and_from_git(fleet_repo: Repo) -> None:
    """Parent and child are answered from the commits themselves; anything further asks git."""
    base = fleet_repo.repo.head.commit.hexsha
    one = fleet_repo.request("req-a1", 1)
    two = fleet_repo.request("req-a2", 1)
    fleet_repo.repo.git.checkout("-q", "-b", "side", base)
    side = fleet_repo.request("req-a3", 1)
    source = heads.LocalHead(fleet_repo.root, threading.Event())
    try:
        assert source.is_ancestor(base, one) and source.is_ancestor(one, two) and source.is_ancestor(base, two)
        assert (
            not source.is_ancestor(two, one) and not source.is_ancestor(one, base) and not source.is_ancestor(two, base)
        )
        assert (
            not source.is_ancestor(one, side) and not source.is_ancestor(side, two) and source.is_ancestor(base, side)
        )
        assert not source.is_ancestor(two, two) and not source.is_ancestor("0" * 40, two)
    finally:
        source.close()


def test_remote_branch_is_polled_and_applied_without_touching_the_checkout(
    fleet_repo: Repo, tmp_path: Path, db_url: str, conn: connections.Connection
) -> None:
    bare = git.Repo.clone_from(fleet_repo.root, tmp_path / "remote.git", bare=True)
    fleet_repo.repo.create_remote("origin", str(tmp_path / "remote.git"))
    clone = git.Repo.clone_from(tmp_path / "remote.git", tmp_path / "reconciler-clone")
    checkout_head = clone.head.commit.hexsha
    stop = threading.Event()
    source = heads.RemoteBranch(tmp_path / "reconciler-clone", "origin", "main", stop)
    loop = watching.Loop(
        tmp_path / "reconciler-clone",
        source,
        lambda: connections.connect(db_url, autocommit=True),
        stop=stop,
        interval=3600,
    )
    try:
        first = loop.step()
        assert first is not None and first.kind == "applied" and first.revision == checkout_head
        sha = fleet_repo.request("req-remote", 1)
        fleet_repo.repo.git.push("origin", "main")
        event = loop.step()
        assert event is not None and event.kind == "applied" and event.revision == sha
        assert claims(conn, "req-remote")
        assert clone.head.commit.hexsha == checkout_head  # the tree was read at the fetched commit
        bare.git.update_ref("-d", "refs/heads/main")  # the branch disappears upstream
        gone = loop.step()
        assert gone is not None and gone.kind == "error" and "gitops.fetch" in gone.message
    finally:
        loop.close()
        source.close()
