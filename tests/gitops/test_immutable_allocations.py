"""An allocation that holds claims cannot be edited; a resize is a release and a new request (issue 26).

Regression: `gpu_count: 2` -> `4` in a placed allocation's file, committed and
applied, was "allocation changed": `status` showed 4 GPUs over 2 claims and
`gpuaas db check` failed (`slice_claim_count`). Now `apply`, the loop and
`plan` refuse it with `desired.allocation.immutable` at the file, line and
field, and the store keeps the last valid revision.
"""

from __future__ import annotations

import json
import re

import pytest

from reconciler import cli
from reconciler.store import connections, revisions
from tests.gitops.conftest import Repo, claims, history_rows, make_loop

CODE = "desired.allocation.immutable"
IMAGE = "h200-ubuntu-24.04-gpuaas-slice"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _placed(repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str], conn: connections.Connection) -> str:
    """alloc-r1 (2 GPUs) placed by `gpuaas apply`; returns the applied commit."""
    sha = repo.request("alloc-r1", 2)
    rc, _, err = _cli(capsys, "apply", str(repo.root), "--db-url", db_url)
    assert rc == 0, err
    assert len(claims(conn, "alloc-r1")) == 2
    return sha


def _row(conn: connections.Connection) -> tuple[object, ...]:
    row = conn.execute(
        "SELECT tenant, gpu_count, image, vm_profile, status FROM allocations WHERE id = 'alloc-r1'"
    ).fetchone()
    assert row is not None
    return tuple(row)


def _line_of(repo: Repo, err: str, field: str) -> None:
    """The problem names the file, and its line holds the field."""
    found = re.search(rf"allocations/alloc-r1\.yaml:(\d+):\d+: {CODE}: {field}: ", err)
    assert found, err
    lines = (repo.root / "allocations/alloc-r1.yaml").read_text().splitlines()
    assert lines[int(found[1]) - 1].startswith(f"{field}:"), (found[0], lines)


@pytest.mark.parametrize(
    ("field", "old", "new"),
    [
        ("gpu_count", "gpu_count: 2", "gpu_count: 4"),
        ("tenant", "tenant: acme", "tenant: globex"),
        ("image", "region: us-east-1", f"region: us-east-1\nimage: {IMAGE}"),
        ("vm_profile", "region: us-east-1", "region: us-east-1\nvm_profile: h200_2g_48c_128g"),
    ],
)
def test_apply_refuses_an_edit_of_a_placed_allocation(
    fleet_repo: Repo,
    db_url: str,
    conn: connections.Connection,
    capsys: pytest.CaptureFixture[str],
    *,
    field: str,
    old: str,
    new: str,
) -> None:
    good = _placed(fleet_repo, db_url, capsys, conn)
    before, held = _row(conn), claims(conn, "alloc-r1")
    fleet_repo.edit("allocations/alloc-r1.yaml", old, new)
    bad = fleet_repo.commit(f"alloc-r1: {field}")
    rc, out, err = _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)
    assert rc == 1 and out == ""
    if field in ("gpu_count", "tenant"):
        _line_of(fleet_repo, err, field)
    assert f": {CODE}: {field}: allocation alloc-r1 holds claims" in err
    assert "error: apply.invalid: 1 error(s) against the store: nothing applied" in err
    assert "Traceback" not in err
    # nothing half-written: the row, the claims and the revision in force are the last valid ones
    assert _row(conn) == before and claims(conn, "alloc-r1") == held
    assert revisions.latest_applied(conn) == good
    assert history_rows(conn)[-1] == (bad, f"cli {fleet_repo.root}", "error")
    rc, out, _ = _cli(capsys, "db", "check", "--db-url", db_url)
    assert rc == 0, out


def test_a_resize_is_a_release_and_a_new_request(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    _placed(fleet_repo, db_url, capsys, conn)
    fleet_repo.release("alloc-r1")
    fleet_repo.request("alloc-r2", 4)
    rc, _, err = _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)
    assert rc == 0, err
    assert {s for _, _, s in claims(conn, "alloc-r1")} == {"releasing"}
    assert len(claims(conn, "alloc-r2")) == 4


def test_an_edit_before_placement_is_allowed(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only claims fix the sale: a request still pending may be edited."""
    fleet_repo.drain("h200-use1-s01")
    fleet_repo.drain("h200-use1-s02")
    fleet_repo.request("alloc-r1", 2)
    assert _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 0
    assert claims(conn, "alloc-r1") == []
    fleet_repo.edit("allocations/alloc-r1.yaml", "gpu_count: 2", "gpu_count: 4")
    fleet_repo.commit("alloc-r1: 4 GPUs before it was placed")
    rc, _, err = _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)
    assert rc == 0, err


def test_the_loop_refuses_it_once_and_keeps_the_last_valid_revision(
    fleet_repo: Repo, db_url: str, conn: connections.Connection
) -> None:
    run = make_loop(fleet_repo, db_url)
    try:
        good = fleet_repo.request("alloc-r1", 2)
        assert run.step() is not None and run.events[-1].kind == "applied"
        fleet_repo.edit("allocations/alloc-r1.yaml", "gpu_count: 2", "gpu_count: 4")
        bad = fleet_repo.commit("alloc-r1: 4 GPUs")
        event = run.step()
        assert event is not None and event.kind == "invalid" and event.revision == bad
        assert CODE in event.message and "last valid revision stays in force" in event.message
        assert run.step() is None  # recorded once: not retried, not reported again
        assert revisions.latest_applied(conn) == good
        assert [r for r in history_rows(conn) if r[0] == bad] == [(bad, f"apply {run.loop.source.label}", "error")]
        problems = conn.execute("SELECT errors FROM reconciliations WHERE revision = %s", (bad,)).fetchone()
        assert problems is not None and problems[0][0]["code"] == CODE
        assert problems[0][0]["file"] == "allocations/alloc-r1.yaml"
        assert len(claims(conn, "alloc-r1")) == 2
        assert conn.execute("SELECT gpu_count FROM allocations WHERE id = 'alloc-r1'").fetchone() == (2,)
        # the fix is the documented resize: the next commit releases it and requests 4 GPUs anew
        fleet_repo.edit("allocations/alloc-r1.yaml", "gpu_count: 4", "gpu_count: 2")
        fleet_repo.commit("alloc-r1: back to 2")
        fleet_repo.release("alloc-r1")
        fleet_repo.request("alloc-r2", 4)
        event = run.step()
        assert event is not None and event.kind == "applied", event
        assert len(claims(conn, "alloc-r2")) == 4
    finally:
        run.loop.close()
        run.loop.source.close()


def test_plan_refuses_the_edit_head_against_base(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    base = fleet_repo.request("alloc-r1", 2)
    fleet_repo.edit("allocations/alloc-r1.yaml", "gpu_count: 2", "gpu_count: 4")
    head = fleet_repo.commit("alloc-r1: 4 GPUs")
    rc, out, err = _cli(
        capsys, "plan", str(fleet_repo.root), "--offline", "--base", base, "--head", head, "--no-cache", "-o", "json"
    )
    assert rc == 1, err
    doc = json.loads(out)
    assert [(e["code"], e["file"]) for e in doc["errors"]] == [(CODE, "allocations/alloc-r1.yaml")]
    assert "gpu_count: allocation alloc-r1 holds claims: gpu_count is fixed at 2, not 4" in doc["errors"][0]["message"]
    assert "plan.invalid" in err
    rc, out, _ = _cli(capsys, "plan", str(fleet_repo.root), "--offline", "--base", base, "--head", head, "--no-cache")
    assert rc == 1 and re.search(rf"allocations/alloc-r1\.yaml:\d+:\d+: {CODE}: gpu_count", out), out


def test_nothing_of_a_refused_commit_is_written(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    """Other changes in the same commit (a drain, a new request) stay unwritten: one transaction rolled back."""
    _placed(fleet_repo, db_url, capsys, conn)
    generation = conn.execute("SELECT generation FROM inventory_generation").fetchone()
    fleet_repo.edit("nodes/h200-use1-s02.yaml", "admin_state: active", "admin_state: draining")
    fleet_repo.edit("allocations/alloc-r1.yaml", "gpu_count: 2", "gpu_count: 4")
    fleet_repo.commit("drain s02, grow alloc-r1")
    fleet_repo.request("alloc-r3", 1)
    assert _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 1
    assert conn.execute("SELECT admin_state FROM nodes WHERE name = 'h200-use1-s02'").fetchone() == ("active",)
    assert conn.execute("SELECT count(*) FROM allocations WHERE id = 'alloc-r3'").fetchone() == (0,)
    assert conn.execute("SELECT generation FROM inventory_generation").fetchone() == generation
