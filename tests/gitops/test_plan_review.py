"""What a reviewer reads in a PR plan: old -> new values of a changed document, and no `x -> x` noise."""

from __future__ import annotations

import json

import pytest

from reconciler import cli
from reconciler.placement import inventory_diff
from tests.gitops.conftest import Repo


def _plan(capsys: pytest.CaptureFixture[str], repo: Repo, *args: str) -> str:
    capsys.readouterr()
    assert cli.main(["plan", str(repo.root), "--offline", "--base", "main", "--head", "pr", *args]) == 0
    return capsys.readouterr().out


def test_a_changed_field_shows_its_old_and_new_value(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    fleet_repo.repo.git.checkout("-b", "pr")
    fleet_repo.edit("nodes/h200-use1-s01.yaml", "admin_state: active", "admin_state: draining")
    fleet_repo.edit(
        "slotmaps/h200-use1-s02.yaml", "private_ip: 10.100.0.10\n", "private_ip: 10.100.0.10\n    enabled: false\n"
    )  # the first slot
    fleet_repo.commit("drain s01, disable a slot of s02")
    text = _plan(capsys, fleet_repo)
    assert "~ Node h200-use1-s01 (admin_state: active -> draining)" in text
    assert "~ SlotMap h200-use1-s02 (slots[0].enabled: true -> false)" in text
    md = _plan(capsys, fleet_repo, "-o", "markdown")
    assert "| \\~ changed | Node | `h200-use1-s01` | admin\\_state: active → draining |" in md
    doc = json.loads(_plan(capsys, fleet_repo, "-o", "json"))
    assert {
        "kind": "Node",
        "name": "h200-use1-s01",
        "field": "admin_state",
        "before": "active",
        "after": "draining",
    } in doc["inventory"]["values"]


def test_long_and_many_values_are_cut() -> None:
    before = {"slots": [{"slot_index": i, "enabled": True} for i in range(30)], "note": "x" * 100}
    after = {"slots": [{"slot_index": i, "enabled": False} for i in range(30)], "note": "y" * 100}
    leaves = list(inventory_diff._leaf_changes("", before, after))
    assert len(leaves) == 31 and leaves[-1].path == "slots[29].enabled"
    assert leaves[0].render() == f"note: {'x' * 45}... -> {'y' * 45}..."
    change = inventory_diff.DocumentChange("SlotMap", "n", "changed", ("slots",), tuple(leaves[:20]), 11)
    assert change.rendered_values().endswith("slots[18].enabled: true -> false; and 11 more")


def test_a_node_whose_capability_does_not_change_shows_no_arrow_for_it(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.repo.git.checkout("-b", "pr")
    fleet_repo.request("req-1", 1)
    doc = json.loads(_plan(capsys, fleet_repo, "-o", "json"))
    (node,) = doc["nodes"]
    assert node["capability_before"] == node["capability_after"] == "both_capable"
    assert node["mode_before"] != node["mode_after"]
    md = _plan(capsys, fleet_repo, "-o", "markdown")
    (row,) = [line for line in md.splitlines() if line.startswith(f"| `{node['node']}` |")]
    assert "both\\_capable → both\\_capable" not in row
    assert row.startswith(f"| `{node['node']}` | both\\_capable | both\\_capable → slice\\_active |")
    text = _plan(capsys, fleet_repo)
    assert "both_capable -> both_capable" not in text and "mode both_capable -> slice_active" in text


def test_a_removed_document_reads_removed_as_the_sync_records_it(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    """The PR plan and the sync (`RowChange`, tests/claims/test_inventory.py) use one word for a file git drops."""
    fleet_repo.repo.git.checkout("-b", "pr")
    fleet_repo.remove("slotmaps/h200-use1-s02.yaml")
    fleet_repo.commit("retire s02's slot map")
    assert "  - SlotMap h200-use1-s02" in _plan(capsys, fleet_repo)
    doc = json.loads(_plan(capsys, fleet_repo, "-o", "json"))
    removed = {"kind": "SlotMap", "name": "h200-use1-s02", "action": "removed", "fields": []}
    assert removed in doc["inventory"]["changes"]
    assert "| \\- removed | SlotMap | `h200-use1-s02` |" in _plan(capsys, fleet_repo, "-o", "markdown")
