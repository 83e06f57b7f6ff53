"""Saved plans: `gpuaas plan --out FILE`, then `gpuaas apply FILE` applies exactly it, or refuses as stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler import cli
from reconciler.reconcile import planfiles
from reconciler.store import connections
from tests.gitops.conftest import EXAMPLE, Repo, claims, history_rows


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _save(capsys: pytest.CaptureFixture[str], repo: Path, db_url: str, out: Path, *extra: str) -> dict[str, Any]:
    rc, _, err = _run(capsys, "plan", str(repo), "--db-url", db_url, "--out", str(out), *extra)
    assert rc in (0, 2), err
    assert f"plan saved to {out}" in err
    doc = json.loads(out.read_text())
    assert isinstance(doc, dict)
    return doc


def test_out_is_its_own_flag_not_an_abbreviation_of_output(
    fleet_repo: Repo, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    rc, stdout, _ = _run(capsys, "plan", str(fleet_repo.root), "--db-url", db_url, "--out", str(out))
    assert rc == 0 and stdout.startswith("Plan: ")  # text on stdout: --out did not become -o
    assert json.loads(out.read_text())["format"] == "gpuaas.io/plan"
    with pytest.raises(SystemExit):  # and no other flag abbreviates either
        cli.main(["plan", str(fleet_repo.root), "--outp", "json"])
    with pytest.raises(SystemExit):
        cli.main(["apply", str(fleet_repo.root), "--allow"])


def test_a_saved_plan_round_trip_applies_exactly_the_plan(
    fleet_repo: Repo, db_url: str, tmp_path: Path, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-4", 4)
    head = fleet_repo.request("req-1", 1)
    plan_file = tmp_path / "plan.json"
    doc = _save(capsys, fleet_repo.root, db_url, plan_file, "--detailed-exitcode")
    assert (doc["format"], doc["version"], doc["head_revision"], doc["valid"], doc["offline"]) == (
        "gpuaas.io/plan",
        1,
        head,
        True,
        False,
    )
    assert doc["base_revision"] is None and doc["repo"] == str(fleet_repo.root.resolve())
    assert len(doc["desired_hash"]) == 64 and len(doc["observed_digest"]) == 64
    planned = {p["allocation_id"]: (p["node"], p["slot_indexes"]) for p in doc["decisions"]["placements"]}
    assert set(planned) == {"req-4", "req-1"} and doc["decisions"]["pending"] == []
    assert doc["plan"]["placements"] and doc["plan"]["inventory"]["changes"]  # the whole PR plan is in it
    assert {h["node"] for h in doc["host_plans"]} >= {node for node, _ in planned.values()}
    assert claims(conn, "req-4") == []  # planning wrote nothing

    rc, out, err = _run(capsys, "apply", str(plan_file), "--db-url", db_url, "-o", "json")
    assert rc == 0, err
    applied = json.loads(out)
    assert applied["revision"] == head
    assert {p["allocation_id"]: (p["node"], p["slot_indexes"]) for p in applied["placements"]} == planned
    for aid, (node, slots) in planned.items():
        assert [(n, i) for n, i, _ in claims(conn, aid)] == [(node, i) for i in slots]
    assert [(r, s.split()[0], res) for r, s, res in history_rows(conn)] == [(head, "cli", "changed")]

    # The same file again: the database moved (it was applied), so it is stale.
    rc, _, err = _run(capsys, "apply", str(plan_file), "--db-url", db_url)
    assert rc == 1 and err.startswith("error: apply.plan_stale: the database moved since")


def test_a_plan_is_stale_when_the_database_moved(
    fleet_repo: Repo, db_url: str, tmp_path: Path, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-a", 8)
    plan_file = tmp_path / "plan.json"
    _save(capsys, fleet_repo.root, db_url, plan_file)
    # Someone else applies first (the loop, another operator): req-a now holds s01 or s02.
    assert _run(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 0
    before = history_rows(conn)
    rc, _, err = _run(capsys, "apply", str(plan_file), "--db-url", db_url)
    assert rc == 1 and "apply.plan_stale" in err and "Traceback" not in err
    assert history_rows(conn) == before  # refused before anything ran


def test_a_plan_is_stale_when_the_desired_state_moved(
    tmp_path: Path, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "plain"  # outside git: head is the directory, pinned by its content hash
    shutil.copytree(EXAMPLE, root)
    plan_file = tmp_path / "plan.json"
    doc = _save(capsys, root, db_url, plan_file)
    assert doc["head_revision"].startswith("tree:")
    alloc = root / "allocations/alloc-0001.yaml"
    alloc.write_text(alloc.read_text().replace("gpu_count: 1", "gpu_count: 2"))
    rc, _, err = _run(capsys, "apply", str(plan_file), "--db-url", db_url)
    assert rc == 1 and err.startswith("error: apply.plan_stale: the desired state at tree:")
    assert history_rows(conn) == []
    alloc.write_text(alloc.read_text().replace("gpu_count: 2", "gpu_count: 1"))  # back as planned: applies
    rc, out, err = _run(capsys, "apply", str(plan_file), "--db-url", db_url)
    assert rc == 0, err
    assert out.splitlines()[1] == f"revision {doc['head_revision']}"


def test_the_planner_guard_refuses_decisions_that_differ_from_the_saved_ones(  # noqa: PLR0917 - fixtures
    fleet_repo: Repo,
    db_url: str,
    tmp_path: Path,
    conn: connections.Connection,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer that moves the database between apply's check and its planner cannot change what is placed."""
    fleet_repo.request("req-a", 8)
    plan_file = tmp_path / "plan.json"
    _save(capsys, fleet_repo.root, db_url, plan_file)
    assert _run(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 0
    placed = claims(conn, "req-a")
    monkeypatch.setattr(planfiles, "check_database", lambda saved, digest: None)  # the race: the check saw nothing
    doc = json.loads(plan_file.read_text())
    assert doc["decisions"]["placements"]  # planned: place req-a; now it is placed already, nothing to place
    rc, _, err = _run(capsys, "apply", str(plan_file), "--db-url", db_url)
    assert rc == 1 and err.startswith("error: apply.plan_stale: the planner now decides otherwise")
    assert claims(conn, "req-a") == placed
    assert history_rows(conn)[-1][2] == "error"


def test_plans_that_cannot_be_applied_are_refused_with_a_code(
    fleet_repo: Repo, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offline = tmp_path / "offline.json"
    rc, _, err = _run(capsys, "plan", str(fleet_repo.root), "--offline", "--out", str(offline))
    assert rc == 0 and "for review only" in err
    cases: list[tuple[str, str]] = [(str(offline), "apply.plan_offline")]
    good = json.loads(offline.read_text()) | {"offline": False}
    for name, doc, code in (
        ("v2.json", good | {"version": 2}, "apply.plan_version"),
        (
            "edited.json",
            good | {"decisions": {"placements": [], "releases": [], "pending": ["forged"]}},
            "apply.plan_unreadable",
        ),
        ("other.json", {"format": "terraform"}, "apply.plan_unreadable"),
        ("invalid.json", good | {"valid": False}, "apply.plan_invalid"),
    ):
        (tmp_path / name).write_text(json.dumps(doc))
        cases.append((str(tmp_path / name), code))
    (tmp_path / "garbage.json").write_bytes(b"\xff\xfe not json")
    cases.append((str(tmp_path / "garbage.json"), "apply.plan_unreadable"))
    for path, code in cases:
        rc, _, err = _run(capsys, "apply", path, "--db-url", db_url)
        assert rc == 1 and err.startswith(f"error: {code}: "), (path, err)
    rc, _, err = _run(capsys, "apply", str(offline), "--rev", "HEAD", "--db-url", db_url)
    assert rc == 1 and err.startswith("error: apply.usage: ")


def test_nothing_is_saved_for_an_invalid_head(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.write("allocations/bad.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: x\n")
    fleet_repo.commit("bad")
    out = tmp_path / "plan.json"
    rc, _, err = _run(capsys, "plan", str(fleet_repo.root), "--offline", "--out", str(out))
    assert rc == 1 and "plan.invalid" in err and not out.exists()


def test_a_plan_made_before_the_first_migration_applies_to_the_fresh_schema(
    fleet_repo: Repo, empty_db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = fleet_repo.request("req-1", 1)
    plan_file = tmp_path / "plan.json"
    rc, _, err = _run(capsys, "plan", str(fleet_repo.root), "--db-url", empty_db_url, "--out", str(plan_file))
    assert rc == 0 and "the database has no schema yet" in err
    rc, out, err = _run(capsys, "apply", str(plan_file), "--db-url", empty_db_url)
    assert rc == 0, err
    assert f"revision {head}" in out and "req-1" in out
