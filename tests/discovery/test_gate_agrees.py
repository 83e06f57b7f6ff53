"""`gpuaas host gate` and `gpuaas validate` agree about the same approved map.

Both read one eligibility function (policies.eligibility): a slot validate
reports as "can never be scheduled" is ineligible at the gate with the same
reason codes. The gate may block more, but only for what discovery alone can
see (a drifted identity, a disk the host mounted since approval); those
slots are listed here explicitly, by code.

Maps: the example fleet's approved slot maps, and each recorded host's own
candidate with `approval_required: true` deleted (issue 17: on the MI300X
host the gate said "7 in service, 1 blocked" while validate found 4 slots
that can never be scheduled).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from desired import problems as p
from host_reconciler import discoverycommand as discovery_cli
from host_reconciler.discovery import discovering, gating
from reconciler import cli, sources
from tests.discovery.conftest import FLEET, NODES, TREES

_WARNING = re.compile(r"^node (\S+) slot (\d+) can never be scheduled \(([^)]*)\)")

# Slots the gate blocks beyond validate, with the discovery-only codes that block them.
DRIFT_ONLY_EXAMPLE: dict[str, dict[int, set[str]]] = {
    "xe9680l-h200": {},
    "xe9680l-h200-shared-parent": {},
    # The example map approves slot 7; the recorded host has since mounted its disk as a share.
    "xe9680-mi300x-roce": {7: {gating.DISK_MOUNTED}},
}


def validate_unschedulable(repo: Path, node: str) -> dict[int, set[str]]:
    """What `gpuaas validate` reports for `node`: slot index -> reason codes."""
    result = sources.load(repo)
    assert result.errors == [], [e.render() for e in result.errors]
    out: dict[int, set[str]] = {}
    for w in result.warnings:
        match = _WARNING.match(w.message)
        if w.code == p.SLOT_UNSCHEDULABLE and match and match[1] == node:
            out[int(match[2])] = set(match[3].split(","))
    return out


def gate_verdict(slotmap: Path, root: Path) -> gating.GateResult:
    return gating.gate(discovery_cli.load_slot_map(slotmap), discovering.discover(root))


def assert_agree(result: gating.GateResult, validated: dict[int, set[str]], drift_only: dict[int, set[str]]) -> None:
    assert {i: {r.code for r in why} for i, why in result.ineligible.items()} == validated
    drifted = {i: {d.code for d in ds} for i, ds in result.blocked.items() if i not in validated}
    assert drifted == drift_only
    assert set(result.unschedulable) == set(validated) | set(drift_only)
    assert set(result.schedulable).isdisjoint(result.unschedulable)


@pytest.mark.parametrize("tree", TREES)
def test_gate_and_validate_agree_on_the_example_maps(tree: str, trees: dict[str, Path]) -> None:
    node = NODES[tree]
    result = gate_verdict(FLEET / "slotmaps" / f"{node}.yaml", trees[tree])
    assert_agree(result, validate_unschedulable(FLEET, node), DRIFT_ONLY_EXAMPLE[tree])


@pytest.mark.parametrize("tree", TREES)
def test_gate_and_validate_agree_on_each_approved_candidate(
    tree: str, trees: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = NODES[tree]
    assert cli.main(["host", "discover", "--sysfs-root", str(trees[tree]), "--node", node]) == 0
    out = capsys.readouterr().out
    repo = tmp_path / "fleet"
    shutil.copytree(FLEET, repo)
    # The operator's approval: the same text minus one line, in place of the example map.
    slotmap = repo / "slotmaps" / f"{node}.yaml"
    candidate_map = out.split("\n---\n")[0]
    slotmap.write_text("\n".join(x for x in candidate_map.splitlines() if x != "approval_required: true") + "\n")
    validated = validate_unschedulable(repo, node)
    result = gate_verdict(slotmap, trees[tree])
    # A freshly discovered map matches its host: every blocked slot is blocked by policy too.
    assert_agree(result, validated, {})
    assert result.schedulable == tuple(i for i in range(8) if i not in validated)


def test_mi300x_candidate_blocks_the_four_slots_validate_reports(
    trees: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case, end to end through both commands' text output."""
    root = trees["xe9680-mi300x-roce"]
    assert cli.main(["host", "discover", "--sysfs-root", str(root)]) == 0
    candidate_map = capsys.readouterr().out.split("\n---\n")[0]
    approved = tmp_path / "mi300x-euw1-r01.yaml"
    approved.write_text(candidate_map.replace("approval_required: true\n", ""))
    status = cli.main(["host", "gate", str(approved), "--sysfs-root", str(root)])
    out = capsys.readouterr().out
    assert status == discovery_cli.EXIT_BLOCKED
    assert out.splitlines()[-1].startswith("mi300x-euw1-r01: 4 slot(s) in service, 4 blocked")
    blocked = {int(x) for x in re.findall(r"^slot (\d+): ", out, re.MULTILINE)}
    assert blocked == {3, 5, 6, 7}
