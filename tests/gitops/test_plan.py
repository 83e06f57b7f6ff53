"""`gpuaas plan` on real git repositories: what a pull request would do, with terraform-style exit codes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler import cli
from reconciler.store import connections
from tests.gitops.conftest import Repo, history_rows, make_loop


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _branch(repo: Repo, name: str) -> None:
    repo.repo.git.checkout("-b", name)


def _json(capsys: pytest.CaptureFixture[str], repo: Repo, *args: str) -> tuple[int, dict[str, Any]]:
    rc, out, _ = _plan(capsys, str(repo.root), "-o", "json", *args)
    return rc, json.loads(out)


@pytest.fixture
def without_s02_slots(fleet_repo: Repo) -> Repo:
    """main: s02 declared without a slot map, s01 full (one 8-GPU request); the PR branch adds the slot map."""
    text = (fleet_repo.root / "slotmaps/h200-use1-s02.yaml").read_text()
    fleet_repo.remove("slotmaps/h200-use1-s02.yaml")
    fleet_repo.commit("s02 not approved yet")
    fleet_repo.request("req-8a", 8)
    _branch(fleet_repo, "pr")
    fleet_repo.write("slotmaps/h200-use1-s02.yaml", text)
    fleet_repo.commit("approve the slots of h200-use1-s02")
    return fleet_repo


def test_pr_adding_a_slot_map_plans_the_new_capacity(
    without_s02_slots: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc = _json(capsys, without_s02_slots, "--offline", "--base", "main", "--head", "pr", "--detailed-exitcode")
    assert rc == 2 and doc["valid"] and doc["changed"]
    assert {"kind": "SlotMap", "name": "h200-use1-s02", "action": "added", "fields": []} in doc["inventory"]["changes"]
    became = [(s["node"], s["slot_index"]) for s in doc["inventory"]["slots"] if s["schedulable_after"]]
    assert became == [("h200-use1-s02", i) for i in range(8)]
    assert (doc["inventory"]["schedulable_gpus_before"], doc["inventory"]["schedulable_gpus_after"]) == (8, 16)
    node = {n["node"]: n for n in doc["nodes"]}["h200-use1-s02"]
    assert (node["capability_before"], node["capability_after"]) == ("slice_candidate", "both_capable")
    assert (node["mode_before"], node["mode_after"]) == ("slice_candidate", "both_capable")
    assert doc["placements"] == [] and doc["pending"] == []
    capacity = {(c["region"], c["sku"], c["gpu_count"]): (c["before"], c["after"]) for c in doc["capacity"]}
    assert capacity == {
        ("us-east-1", "h200-sxm-slice", 1): (0, 8),
        ("us-east-1", "h200-sxm-slice", 2): (0, 4),
        ("us-east-1", "h200-sxm-slice", 4): (0, 2),
        ("us-east-1", "h200-sxm-slice", 8): (0, 1),
    }


def test_pr_adding_a_slot_map_places_what_waited(without_s02_slots: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    repo = without_s02_slots
    repo.repo.git.checkout("main")
    repo.request("req-8b", 8)  # waits on main: s01 is full
    repo.repo.git.checkout("pr")
    repo.repo.git.merge("main", "--no-edit")
    rc, doc = _json(capsys, repo, "--offline", "--base", "main", "--head", "pr", "--detailed-exitcode")
    assert rc == 2
    (placed,) = doc["placements"]
    assert placed["allocation_id"] == "req-8b" and placed["node"] == "h200-use1-s02"
    assert placed["slot_indexes"] == list(range(8)) and placed["vm_profile"] == "h200_8g_192c_512g"
    assert doc["pending"] == []


def test_pr_plan_text_and_markdown(without_s02_slots: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    root = str(without_s02_slots.root)
    rc, out, _ = _plan(capsys, root, "--offline", "--base", "main", "--head", "pr")
    assert rc == 0  # changes, but no --detailed-exitcode
    assert "+ SlotMap h200-use1-s02" in out
    assert "h200-use1-s02 slots [0,1,2,3,4,5,6,7] become schedulable" in out
    assert "us-east-1    h200-sxm-slice             1 GPU: 0 -> 8" in out
    rc, md, _ = _plan(capsys, root, "--offline", "--base", "main", "--head", "pr", "-o", "markdown")
    lines = md.splitlines()
    assert lines[0] == "<!-- gpuaas-plan -->"
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    first_details = next(i for i, line in enumerate(lines) if line.startswith("<details"))
    assert first_table < first_details  # summary table first, lists collapsible below
    assert "| Schedulable slots | 8 → 16 (+8) |" in md
    assert "<summary><b>Launchable capacity</b> (4)</summary>" in md


def test_pr_with_a_broken_file_plans_nothing_and_exits_1_with_file_line(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    _branch(fleet_repo, "pr")
    fleet_repo.request("req-ok", 1)
    fleet_repo.write(
        "allocations/req-bad.yaml",
        "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: req-bad\ntenant: acme\n"
        "sku: h200-sxm-slice\ngpu_count: 3\nregion: us-east-1\nrequested_at: 2026-11-01T00:00:00Z\n",
    )
    fleet_repo.commit("a request for 3 GPUs")
    for flags in ((), ("--detailed-exitcode",)):
        rc, out, err = _plan(capsys, str(fleet_repo.root), "--offline", "--base", "main", "--head", "pr", *flags)
        assert rc == 1
        assert "allocations/req-bad.yaml:6:" in out and "desired.allocation.gpu_count" in out
        assert "Placements" not in out and "req-ok" not in out
        assert "plan.invalid" in err
    rc, doc = _json(capsys, fleet_repo, "--offline", "--base", "main", "--head", "pr")
    assert rc == 1 and not doc["valid"] and doc["placements"] == [] and doc["errors"][0]["line"] == 6
    rc, md, _ = _plan(capsys, str(fleet_repo.root), "--offline", "--base", "main", "--head", "pr", "-o", "markdown")
    assert rc == 1 and "`allocations/req-bad.yaml:6:" in md and "nothing was planned" in md


def test_no_change_exits_0_with_detailed_exitcode(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    fleet_repo.request("req-a", 1)
    rc, out, _ = _plan(capsys, str(fleet_repo.root), "--offline", "--base", "HEAD", "--detailed-exitcode")
    assert rc == 0 and "Plan: no changes." in out


def test_draining_shows_in_plan_and_takes_no_new_placement(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-running", 1)  # lands on h200-use1-s01 (first node with a free best fit)
    _branch(fleet_repo, "pr")
    fleet_repo.drain("h200-use1-s01")
    fleet_repo.request("req-new", 1)
    rc, doc = _json(capsys, fleet_repo, "--offline", "--base", "main", "--head", "pr", "--detailed-exitcode")
    assert rc == 2
    modes = {n["node"]: (n["mode_before"], n["mode_after"]) for n in doc["nodes"]}
    assert modes["h200-use1-s01"] == ("slice_active", "draining")
    assert [(p["allocation_id"], p["node"]) for p in doc["placements"]] == [("req-new", "h200-use1-s02")]
    assert doc["releases"] == []  # the running allocation stays
    assert {"kind": "Node", "name": "h200-use1-s01", "action": "changed", "fields": ["admin_state"]} in doc[
        "inventory"
    ]["changes"]


def test_plan_against_the_database_reads_claims_and_writes_nothing(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-live", 8)
    run = make_loop(fleet_repo, db_url)
    run.step()
    run.loop.close()
    fleet_repo.request("req-next", 8)
    before = history_rows(conn)
    rc, doc = _json(capsys, fleet_repo, "--db-url", db_url, "--detailed-exitcode")
    assert rc == 2 and not doc["offline"]
    assert doc["base"] == before[-1][0]  # the revision the database runs
    (placed,) = doc["placements"]
    assert placed["allocation_id"] == "req-next" and placed["node"] == "h200-use1-s02"  # s01 is taken
    assert history_rows(conn) == before
    # once applied, the same plan has nothing left to do
    run = make_loop(fleet_repo, db_url)
    run.step()
    run.loop.close()
    rc, doc = _json(capsys, fleet_repo, "--db-url", db_url, "--detailed-exitcode")
    assert rc == 0 and doc["placements"] == []


def test_unknown_base_is_an_error_not_a_traceback(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _plan(capsys, str(fleet_repo.root), "--offline", "--base", "no-such-branch")
    assert rc == 1 and "desired.git.revision" in err and "Traceback" not in err


def test_plan_against_a_database_without_schema_plans_from_nothing(
    fleet_repo: Repo, empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-first", 1)
    rc, doc = _json(capsys, fleet_repo, "--db-url", empty_db_url, "--detailed-exitcode")
    assert rc == 2 and doc["base"] is None
    assert [p["allocation_id"] for p in doc["placements"]] == ["req-first"]
