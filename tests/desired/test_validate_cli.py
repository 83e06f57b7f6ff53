"""`gpuaas validate` as CI and reviewers use it: exit codes, output format, --rev."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import git
import pytest

from reconciler import cli

pytestmark = pytest.mark.integration  # real git repositories and subprocesses

EXAMPLE = Path(__file__).parent.parent.parent / "examples" / "fleet"
BROKEN = Path(__file__).parent / "broken"


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, git.Repo]:
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    r = git.Repo.init(root)
    r.index.add([str(p.relative_to(root)) for p in root.rglob("*.yaml")])
    r.index.commit("valid fleet", author=git.Actor("t", "t@example.com"))
    return root, r


def test_valid_repo_exits_zero_with_one_line_summary(
    repo: tuple[Path, git.Repo], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = repo
    assert cli.main(["validate", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("valid:")] == [
        "valid: 28 files, 8 nodes, 5 slot maps, 3 SKUs, 3 images, 8 allocations; 8 warning(s)"
    ]


def test_errors_print_file_line_col_code_and_exit_one(
    repo: tuple[Path, git.Repo], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = repo
    shutil.copy(BROKEN / "slot_duplicate_vf.yaml", root / "zz.yaml")
    assert cli.main(["validate", str(root)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "zz.yaml:35:28: desired.slot.duplicate_vf: fabric VF 0000:1a:00.1 is already used by slots[0] on node broken-n1"
    )
    assert err[-1].startswith("invalid: 1 error(s)")


def test_rev_reads_the_committed_tree_not_the_working_tree(
    repo: tuple[Path, git.Repo], capsys: pytest.CaptureFixture[str]
) -> None:
    root, r = repo
    good = r.head.commit.hexsha
    shutil.copy(BROKEN / "ref_allocation_sku.yaml", root / "allocations" / "bad.yaml")
    assert cli.main(["validate", str(root), "--rev", good]) == 0
    r.index.add(["allocations/bad.yaml"])
    r.index.commit("bad request", author=git.Actor("t", "t@example.com"))
    (root / "allocations" / "bad.yaml").unlink()  # working tree is clean again, HEAD is not
    assert cli.main(["validate", str(root), "--rev", "HEAD"]) == 1
    assert "allocations/bad.yaml:6:6: desired.ref.unresolved" in capsys.readouterr().err


def test_json_output(repo: tuple[Path, git.Repo], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = repo
    shutil.copy(BROKEN / "field_unknown.yaml", root / "zz.yaml")
    assert cli.main(["validate", str(root), "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert [(e["code"], e["file"], e["line"]) for e in doc["errors"]] == [("desired.field.unknown", "zz.yaml", 12)]
    assert len(doc["warnings"]) == 8


def test_unknown_revision_is_a_clean_error(repo: tuple[Path, git.Repo], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = repo
    assert cli.main(["validate", str(root), "--rev", "no-such-branch"]) == 1
    assert capsys.readouterr().err.startswith("error: desired.git.revision: ")


def test_missing_path_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", str(tmp_path / "nope")]) == 1
    assert "desired.path.missing" in capsys.readouterr().err
