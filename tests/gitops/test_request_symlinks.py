"""The portal bot never writes through a link: a real git repo with symlinks and hard links planted in it.

    repo/allocations/req-x.yaml -> /elsewhere/req-x.yaml     (a file link)
    repo/allocations            -> /elsewhere                (a directory link)
    repo/allocations/req-x.yaml == /elsewhere/req-x.yaml     (a hard link)

Each is refused with `request.file.not_regular`, the file outside the repo is
unchanged, nothing is committed and the tree stays clean.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.reconcile import requestfiles, requests
from tests.gitops.conftest import Repo

REQUEST = (
    "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: {id}\ntenant: acme\nsku: h200-sxm-slice\n"
    "gpu_count: 1\nregion: us-east-1\nstate: present\nrequested_at: 2026-11-01T08:00:00Z\n"
)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["request", *args])
    return rc, capsys.readouterr().err


def _create(capsys: pytest.CaptureFixture[str], repo: Repo, allocation_id: str) -> tuple[int, str]:
    return _run(
        capsys,
        "create",
        "--repo",
        str(repo.root),
        "--tenant",
        "acme",
        "--sku",
        "h200-sxm-slice",
        "--gpus",
        "1",
        "--region",
        "us-east-1",
        f"--id={allocation_id}",
        "--commit",
    )


@pytest.fixture
def outside(tmp_path: Path, fleet_repo: Repo) -> Path:
    (fleet_repo.root / "allocations").mkdir(exist_ok=True)
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / "req-x.yaml").write_text(REQUEST.format(id="req-x"))
    return d


def _unchanged(repo: Repo, before: str, outside: Path) -> None:
    assert repo.repo.head.commit.hexsha == before
    assert (outside / "req-x.yaml").read_text() == REQUEST.format(id="req-x")
    assert sorted(p.name for p in outside.iterdir()) == ["req-x.yaml"]


def test_release_refuses_a_symlinked_request_file(
    fleet_repo: Repo, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = fleet_repo.root / "allocations" / "req-x.yaml"
    link.symlink_to(outside / "req-x.yaml")
    fleet_repo.commit("a symlinked request")
    before = fleet_repo.repo.head.commit.hexsha
    rc, err = _run(capsys, "release", "req-x", "--repo", str(fleet_repo.root), "--commit")
    assert rc == 1 and "error: request.file.not_regular: allocations/req-x.yaml: is a symlink or not" in err
    _unchanged(fleet_repo, before, outside)
    assert link.is_symlink() and not fleet_repo.repo.is_dirty(untracked_files=True)


def test_release_refuses_a_hard_link_to_a_file_elsewhere(
    fleet_repo: Repo, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.link(outside / "req-x.yaml", fleet_repo.root / "allocations" / "req-x.yaml")
    fleet_repo.commit("a hard-linked request")
    before = fleet_repo.repo.head.commit.hexsha
    rc, err = _run(capsys, "release", "req-x", "--repo", str(fleet_repo.root), "--commit")
    assert rc == 1 and "request.file.not_regular" in err and "hard links" in err
    _unchanged(fleet_repo, before, outside)


@pytest.mark.parametrize(
    "case",
    [
        ("allocations", "allocations: is a symlink or not a directory"),
        ("allocations/req-x.yaml", "allocations/req-x.yaml: is a symlink;"),
    ],
    ids=["directory", "file"],
)
def test_release_refuses_a_link_swapped_in_after_the_lookup(
    fleet_repo: Repo,
    outside: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, str],
) -> None:
    swapped, message = case
    fleet_repo.write("allocations/req-x.yaml", REQUEST.format(id="req-x"))
    fleet_repo.commit("a request")
    before = fleet_repo.repo.head.commit.hexsha
    found = requests._find

    def find_then_swap(root: Path, allocation_id: str) -> str:
        rel = found(root, allocation_id)
        (root / swapped).rename(root.parent / "moved-away")
        (root / swapped).symlink_to(outside if swapped == "allocations" else outside / "req-x.yaml")
        return rel

    monkeypatch.setattr(requests, "_find", find_then_swap)
    rc, err = _run(capsys, "release", "req-x", "--repo", str(fleet_repo.root), "--commit")
    assert rc == 1 and f"error: request.file.not_regular: {message}" in err
    _unchanged(fleet_repo, before, outside)


def test_create_refuses_a_symlinked_allocations_directory(
    fleet_repo: Repo, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    allocations = fleet_repo.root / "allocations"
    for f in allocations.iterdir():
        f.unlink()
    allocations.rmdir()
    allocations.symlink_to(outside, target_is_directory=True)
    fleet_repo.commit("allocations is a link now")
    before = fleet_repo.repo.head.commit.hexsha
    rc, err = _create(capsys, fleet_repo, "req-new")
    assert rc == 1 and "error: request.file.not_regular: allocations: is a symlink" in err
    _unchanged(fleet_repo, before, outside)


def test_create_refuses_a_dangling_link_where_the_file_would_go(
    fleet_repo: Repo, outside: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = fleet_repo.root / "allocations" / "req-new.yaml"
    link.symlink_to(outside / "planted.yaml")  # does not exist: Path.exists() says False
    fleet_repo.commit("a dangling link")
    before = fleet_repo.repo.head.commit.hexsha
    rc, err = _create(capsys, fleet_repo, "req-new")
    assert rc == 1 and "error: request.file.not_regular: allocations/req-new.yaml" in err
    _unchanged(fleet_repo, before, outside)
    assert link.is_symlink() and not (outside / "planted.yaml").exists()


@pytest.mark.parametrize("bad", ["../../escape", "a/b", "UPPER", "-x"])
def test_create_refuses_an_id_that_is_not_a_file_name(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    before = fleet_repo.repo.head.commit.hexsha
    rc, err = _create(capsys, fleet_repo, bad)
    assert rc == 1 and "error: request.id:" in err
    assert fleet_repo.repo.head.commit.hexsha == before and not fleet_repo.repo.is_dirty(untracked_files=True)


def test_release_replaces_a_regular_file_and_keeps_its_mode(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    path = fleet_repo.root / "allocations" / "req-x.yaml"
    fleet_repo.write("allocations/req-x.yaml", REQUEST.format(id="req-x"))
    path.chmod(0o640)
    fleet_repo.commit("a request")
    rc, _ = _run(capsys, "release", "req-x", "--repo", str(fleet_repo.root), "--commit")
    assert rc == 0
    assert path.read_text() == REQUEST.format(id="req-x").replace("state: present", "state: released")
    assert not path.is_symlink() and path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in path.parent.iterdir() if p.name.startswith(".")) == []  # no temp file left
    assert not fleet_repo.repo.is_dirty(untracked_files=True)


def test_the_bot_gets_the_refusal_as_json(fleet_repo: Repo, outside: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (fleet_repo.root / "allocations" / "req-x.yaml").symlink_to(outside / "req-x.yaml")
    capsys.readouterr()
    rc = cli.main(["request", "release", "req-x", "--repo", str(fleet_repo.root), "-o", "json"])
    out = capsys.readouterr()
    assert rc == 1 and json.loads(out.out)["error"] == requestfiles.NOT_REGULAR
    assert "error: request.file.not_regular:" in out.err
