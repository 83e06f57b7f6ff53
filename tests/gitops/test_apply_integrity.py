"""`gpuaas apply` applies what history records: the committed tree, or a dirty one named `tree:<hash>`.

Regression (issue 17): an allocation file created but not committed was
placed, and history named a commit that does not contain it. And a deleted
allocation file that still holds claims is flagged by `status` as `plan`
flags it.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.reconcile import requests
from reconciler.store import connections
from tests.gitops.conftest import EXAMPLE, REGION, SKU, T0, Repo, claims, history_rows


def _apply(capsys: pytest.CaptureFixture[str], db_url: str, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["apply", *args, "--db-url", db_url])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _uncommitted_request(repo: Repo, allocation_id: str, gpus: int = 1) -> None:
    requests.create(
        repo.root,
        tenant="acme",
        sku=SKU,
        gpus=gpus,
        region=REGION,
        allocation_id=allocation_id,
        now=T0 + dt.timedelta(minutes=30),
    )


def test_an_uncommitted_allocation_is_refused_and_nothing_is_applied(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    _uncommitted_request(fleet_repo, "req-local")
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root))
    assert rc == 1
    assert err.startswith("error: apply.tree_dirty: 1 desired-state file(s)")
    assert "allocations/req-local.yaml (untracked)" in err and "--allow-dirty" in err
    assert "Traceback" not in err
    assert claims(conn, "req-local") == [] and history_rows(conn) == []


def test_modified_and_deleted_files_are_named_too(
    fleet_repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.edit("nodes/h200-use1-s01.yaml", "admin_state: active", "admin_state: draining")
    (fleet_repo.root / "slotmaps/h200-use1-s02.yaml").unlink()
    (fleet_repo.root / "README.md").write_text("not desired state\n")  # not YAML: never read, never dirty
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root))
    assert rc == 1 and "apply.tree_dirty: 2 desired-state file(s)" in err
    assert "nodes/h200-use1-s01.yaml (modified)" in err and "slotmaps/h200-use1-s02.yaml (deleted)" in err


def test_a_clean_tree_applies_head_and_history_names_it(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    sha = fleet_repo.request("req-committed")
    (fleet_repo.root / ".gitignore").write_text("scratch/\n")
    (fleet_repo.root / "scratch").mkdir()
    (fleet_repo.root / "scratch/notes.yaml").write_text("kind: Nonsense\n")  # ignored by git: not desired state
    rc, out, err = _apply(capsys, db_url, str(fleet_repo.root))
    assert rc == 0, err
    assert out.startswith(f"revision {sha}") and "req-committed" in out
    assert [r for r, _, res in history_rows(conn) if res != "error"] == [sha]


def test_allow_dirty_applies_the_working_tree_recorded_as_a_tree_not_as_head(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    head = fleet_repo.repo.head.commit.hexsha
    _uncommitted_request(fleet_repo, "req-local")
    rc, out, err = _apply(capsys, db_url, str(fleet_repo.root), "--allow-dirty", "-o", "json")
    assert rc == 0, err
    assert "warning: applying the working tree: 1 file(s) differ from HEAD" in err
    doc = json.loads(out)
    assert doc["revision"].startswith("tree:") and doc["revision"] != head
    assert [p["allocation_id"] for p in doc["placements"]] == ["req-local"]
    assert [(r, res) for r, _, res in history_rows(conn)] == [(doc["revision"], "changed")]
    assert len(claims(conn, "req-local")) == 1


def test_an_explicit_revision_is_read_from_git_whatever_the_working_tree_holds(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    head = fleet_repo.repo.head.commit.hexsha
    _uncommitted_request(fleet_repo, "req-local")
    rc, out, _ = _apply(capsys, db_url, str(fleet_repo.root), "--rev", "HEAD")
    assert rc == 0 and out.startswith(f"revision {head}") and claims(conn, "req-local") == []
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root), "--rev", "HEAD", "--allow-dirty")
    assert rc == 1 and err.startswith("error: apply.usage: ")


def test_a_subdirectory_is_compared_under_its_own_path(
    tmp_path: Path, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    import git

    top = tmp_path / "monorepo"
    top.mkdir()
    shutil.copytree(EXAMPLE, top / "fleet")
    repo = git.Repo.init(top, initial_branch="main")
    repo.git.add("-A")
    sha = repo.index.commit("fleet").hexsha
    (top / "elsewhere.yaml").write_text("not: ours\n")  # outside PATH: not compared
    rc, out, err = _apply(capsys, db_url, str(top / "fleet"))
    assert rc == 0, err
    assert out.startswith(f"revision {sha}")


def test_a_plain_directory_applies_as_a_tree(
    tmp_path: Path, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "plain"
    shutil.copytree(EXAMPLE, root)
    rc, out, err = _apply(capsys, db_url, str(root))
    assert rc == 0, err
    assert out.startswith("revision tree:")


def test_status_flags_an_allocation_whose_file_was_deleted(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-kept")
    fleet_repo.request("req-gone")
    assert _apply(capsys, db_url, str(fleet_repo.root))[0] == 0
    fleet_repo.remove("allocations/req-gone.yaml")
    fleet_repo.commit("delete a request file (does not release it)")
    assert _apply(capsys, db_url, str(fleet_repo.root))[0] == 0
    assert [s for _, _, s in claims(conn, "req-gone")] == ["reserved"]  # deleting never releases
    capsys.readouterr()
    assert cli.main(["status", "--db-url", db_url, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["orphaned"] == ["req-gone"]
    assert {a["id"]: a["orphaned"] for a in doc["allocations"]} == {"req-kept": False, "req-gone": True}
    assert cli.main(["status", "--db-url", db_url]) == 0
    text = capsys.readouterr().out
    assert "warning: allocations holding claims are no longer declared" in text and ": req-gone" in text
    (line,) = [x for x in text.splitlines() if x.strip().startswith("req-gone")]
    assert "ORPHANED" in line
    # The plan says the same about the same allocation.
    assert cli.main(["plan", str(fleet_repo.root), "--db-url", db_url, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["orphaned"] == ["req-gone"]
