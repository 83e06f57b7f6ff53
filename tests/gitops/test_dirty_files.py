"""`apply.dirty_files`: git's index names the files that may differ from HEAD, the blob comparison decides.

Every answer here is also checked against the full comparison (every YAML
file of the working tree hashed against HEAD's blob ids, as before git was
asked), and each case says whether git's narrowing answered it or the full
comparison did. The cases are those where git's view and the reader's
differ: staged changes, assume-unchanged and skip-worktree entries, stat data
that lies either way, line-ending conversion, symlinks, FIFOs, nested
repositories, files over the reader's limit.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from desired.reading import gitrepo, safefiles
from desired.reading.yamlio import MAX_FILE_BYTES
from reconciler.commands import apply, dirtytree

FILES = {
    "fleet.yaml": "kind: Fleet\n",
    "nodes/a.yaml": "name: a\ngpus: 8\n",
    "nodes/b.yaml": "name: b\ngpus: 8\n",
    "README.md": "the fleet\n",
    ".gitignore": "scratch/\n*.local.yaml\n",
}


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    _write(root, FILES)
    _commit(root)
    return root


def _commit(root: Path) -> None:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "state")


@pytest.fixture
def dirty(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[str]]:
    """dirty_files(path), checked against the full comparison; `narrowed`: whether git's answer was used."""

    def check(path: Path, *, narrowed: bool = True) -> list[str]:
        assert (dirtytree.candidates(path) is not None) is narrowed
        found = apply.dirty_files(path)
        with monkeypatch.context() as m:
            m.setattr(dirtytree, "candidates", lambda _: None)
            assert apply.dirty_files(path) == found, "differs from the full comparison"
        return found

    return check


def test_a_clean_tree_is_answered_without_reading_its_files(
    repo: Path, dirty: Callable[..., list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert dirty(repo) == []

    def unread(root: Path) -> None:
        raise AssertionError("every file read")

    monkeypatch.setattr(safefiles, "iter_directory", unread)
    monkeypatch.setattr(safefiles, "read_regular", unread)
    assert apply.dirty_files(repo) == []


def test_modified_deleted_and_untracked_files_are_named_and_ignored_ones_are_not(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    _write(
        repo,
        {
            "nodes/a.yaml": "name: a\ngpus: 4\n",
            "nodes/c.yaml": "name: c\n",
            "nodes/d.yml": "name: d\n",
            "scratch/notes.yaml": "ignored: directory\n",
            "mine.local.yaml": "ignored: pattern\n",
            "forced.local.yaml": "ignored, but added\n",
            "README.md": "not YAML: never read\n",
            "notes.txt": "not YAML\n",
        },
    )
    (repo / "nodes/b.yaml").unlink()
    _git(repo, "add", "-f", "forced.local.yaml")
    assert dirty(repo) == [
        "forced.local.yaml (untracked)",
        "nodes/a.yaml (modified)",
        "nodes/b.yaml (deleted)",
        "nodes/c.yaml (untracked)",
        "nodes/d.yml (untracked)",
    ]


def test_a_subdirectory_names_its_own_files_relative_to_itself(tmp_path: Path, dirty: Callable[..., list[str]]) -> None:
    top = tmp_path / "mono"
    top.mkdir()
    _git(top, "init", "-q", "-b", "main")
    _write(top, {f"fleet/{rel}": text for rel, text in FILES.items()} | {"other/x.yaml": "x: 1\n"})
    _commit(top)
    _write(top, {"fleet/nodes/a.yaml": "name: a\n", "other/x.yaml": "x: 2\n", "y.yaml": "y: 1\n"})
    assert dirty(top / "fleet") == ["nodes/a.yaml (modified)"]
    assert dirty(top / "fleet/nodes") == ["a.yaml (modified)"]


def test_files_in_hidden_and_skipped_directories_are_not_desired_state(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    _write(repo, {".hidden/kept.yaml": "a: 1\n"})
    _commit(repo)
    _write(
        repo,
        {
            ".hidden/kept.yaml": "a: 2\n",
            ".hidden/new.yaml": "b: 1\n",
            "node_modules/x.yaml": "c: 1\n",
            "nodes/__pycache__/y.yaml": "d: 1\n",
            ".dotfile.yaml": "read: a hidden file is read, a hidden directory is not\n",
        },
    )
    (repo / ".venv").symlink_to("nodes", target_is_directory=True)  # skipped by its name before it is a link
    assert dirty(repo) == [".dotfile.yaml (untracked)"]


def test_staged_changes_count_only_where_the_working_tree_differs_from_head(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    original = (repo / "nodes/a.yaml").read_text()
    _write(repo, {"nodes/a.yaml": "name: a\ngpus: 2\n", "nodes/new.yaml": "staged then removed\n"})
    _git(repo, "add", "-A")
    _write(repo, {"nodes/a.yaml": original})  # staged, then reverted: as HEAD has it
    (repo / "nodes/new.yaml").unlink()  # added to the index, gone from the tree
    _git(repo, "rm", "-q", "--cached", "nodes/b.yaml")  # removed from the index, still in the tree
    assert "MM nodes/a.yaml" in _git(repo, "status", "--porcelain")
    assert dirty(repo) == []
    _write(repo, {"fleet.yaml": "kind: Fleet\nstaged: only\n"})
    _git(repo, "add", "fleet.yaml")  # the working tree holds what is staged: it differs from HEAD
    assert dirty(repo) == ["fleet.yaml (modified)"]


@pytest.mark.parametrize("bit", ["--assume-unchanged", "--skip-worktree"])
def test_a_file_git_is_told_not_to_check_is_still_compared(
    repo: Path, dirty: Callable[..., list[str]], bit: str
) -> None:
    _git(repo, "update-index", bit, "nodes/a.yaml", "nodes/b.yaml")
    _write(repo, {"nodes/a.yaml": "name: a\ngpus: 1\n"})
    (repo / "nodes/b.yaml").unlink()  # as a sparse checkout leaves it
    assert _git(repo, "status", "--porcelain") == ""  # git says nothing changed
    assert dirty(repo) == ["nodes/a.yaml (modified)", "nodes/b.yaml (deleted)"]


def test_a_touched_file_with_its_content_unchanged_is_clean_and_the_index_is_not_rewritten(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    index = repo / ".git/index"
    before = index.read_bytes(), index.stat().st_mtime_ns
    (repo / "nodes/a.yaml").write_text(FILES["nodes/a.yaml"])
    later = index.stat().st_mtime + 3600
    os.utime(repo / "nodes/a.yaml", (later, later))
    assert dirty(repo) == []
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before  # read-only: a concurrent git is undisturbed


def test_a_racily_clean_file_changed_in_the_second_of_the_index_write_is_named(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    # Stat data that matches to the second: same size, same mtime as the entry and as the index itself.
    _git(repo, "config", "core.trustctime", "false")
    _git(repo, "config", "core.checkStat", "minimal")
    path, index = repo / "nodes/a.yaml", repo / ".git/index"
    when = index.stat().st_mtime
    os.utime(path, (when, when))
    _git(repo, "add", "nodes/a.yaml")  # the entry records that mtime
    os.utime(index, (when, when))
    path.write_text(FILES["nodes/a.yaml"].replace("8", "9"))  # same size
    os.utime(path, (when, when))
    assert dirty(repo) == ["nodes/a.yaml (modified)"]


def test_line_endings_converted_on_checkout_are_a_difference_as_the_reader_reads_bytes(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    _write(repo, {".gitattributes": "*.yaml text eol=crlf\n"})
    _commit(repo)
    _checkout_again(repo)
    assert (repo / "nodes/a.yaml").read_bytes().endswith(b"\r\n")
    assert _git(repo, "status", "--porcelain") == ""  # git compares the converted bytes
    assert dirty(repo) == ["fleet.yaml (modified)", "nodes/a.yaml (modified)", "nodes/b.yaml (modified)"]


def test_core_autocrlf_leaves_it_to_the_full_comparison(repo: Path, dirty: Callable[..., list[str]]) -> None:
    _git(repo, "config", "core.autocrlf", "true")
    _checkout_again(repo)
    assert _git(repo, "status", "--porcelain") == ""
    assert dirty(repo, narrowed=False) == [
        "fleet.yaml (modified)",
        "nodes/a.yaml (modified)",
        "nodes/b.yaml (modified)",
    ]


def _checkout_again(root: Path) -> None:
    for rel in ("fleet.yaml", "nodes/a.yaml", "nodes/b.yaml"):
        (root / rel).unlink()
    _git(root, "checkout", "--", ".")


def test_a_committed_symlinked_directory_is_named_as_the_reader_names_it(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    (repo / "linked").symlink_to("nodes", target_is_directory=True)
    _commit(repo)
    assert _git(repo, "status", "--porcelain") == ""
    # HEAD holds no YAML file by that name; the reader reports the link (and never enters it).
    assert dirty(repo, narrowed=False) == ["linked (untracked)"]


def test_a_symlinked_yaml_file_is_never_read_whatever_it_points_at(repo: Path, dirty: Callable[..., list[str]]) -> None:
    (repo / "alias.yaml").symlink_to("nodes/a.yaml")
    _commit(repo)
    (repo / "alias.yaml").unlink()
    (repo / "alias.yaml").symlink_to("nodes/b.yaml")  # git: modified; the reader: a link, as before
    (repo / "nodes/new.yaml").symlink_to("a.yaml")
    assert dirty(repo, narrowed=False) == ["nodes/new.yaml (untracked)"]


def test_a_fifo_with_a_yaml_name_is_named_though_git_never_lists_one(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    os.mkfifo(repo / "nodes/pipe.yaml")
    assert _git(repo, "status", "--porcelain") == ""
    assert dirty(repo, narrowed=False) == ["nodes/pipe.yaml (untracked)"]


def test_a_nested_repository_is_read_into_as_the_reader_reads_it(repo: Path, dirty: Callable[..., list[str]]) -> None:
    vendor = repo / "vendor"
    vendor.mkdir()
    _git(vendor, "init", "-q", "-b", "main")
    _write(vendor, {"x.yaml": "x: 1\n"})
    _commit(vendor)
    assert dirty(repo, narrowed=False) == ["vendor/x.yaml (untracked)"]


def test_a_file_over_the_reader_limit_is_named_as_the_truncated_read_compares(
    repo: Path, dirty: Callable[..., list[str]]
) -> None:
    _write(repo, {"nodes/huge.yaml": "x: 1\n" + "#" * MAX_FILE_BYTES})
    _commit(repo)
    assert _git(repo, "status", "--porcelain") == ""
    assert dirty(repo) == ["nodes/huge.yaml (modified)"]


def test_many_changes_are_looked_up_in_heads_whole_listing(
    repo: Path, dirty: Callable[..., list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(apply, "NAMED_MAX", 1)
    _write(repo, {"nodes/a.yaml": "changed: 1\n", "nodes/z.yaml": "new: 1\n"})
    assert dirty(repo) == ["nodes/a.yaml (modified)", "nodes/z.yaml (untracked)"]


def test_names_git_reads_as_patterns_are_looked_up_as_they_are(repo: Path, dirty: Callable[..., list[str]]) -> None:
    _write(
        repo, {":colon.yaml": "a: 1\n", "star*.yaml": "b: 1\n", "starry.yaml": "c: 1\n", "nodes/größe.yaml": "d: 1\n"}
    )
    _commit(repo)
    _write(repo, {":colon.yaml": "a: 2\n", "star*.yaml": "b: 2\n", "nodes/größe.yaml": "d: 2\n"})
    assert dirty(repo) == [":colon.yaml (modified)", "nodes/größe.yaml (modified)", "star*.yaml (modified)"]


def test_without_git_to_ask_the_full_comparison_answers(
    tmp_path: Path, repo: Path, dirty: Callable[..., list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "plain"
    _write(plain, {"a.yaml": "a: 1\n"})
    assert dirty(plain, narrowed=False) == ["a.yaml (untracked)"]  # not in a work tree
    unborn = tmp_path / "unborn"
    _write(unborn, {"a.yaml": "a: 1\n", "b.local.yaml": "b: 1\n", ".gitignore": "*.local.yaml\n"})
    _git(unborn, "init", "-q", "-b", "main")
    assert dirty(unborn, narrowed=False) == ["a.yaml (untracked)"]  # no HEAD
    _write(repo, {"nodes/a.yaml": "changed: 1\n"})
    monkeypatch.setenv("GIT_INDEX_FILE", str(repo / ".git/index"))  # git pointed elsewhere than the reader
    assert dirty(repo, narrowed=False) == ["nodes/a.yaml (modified)"]


def test_heads_blob_ids_are_looked_up_for_the_names_asked_only(repo: Path) -> None:
    _write(repo, {"conf.yaml/inner.yaml": "a: 1\n", ".hidden/x.yaml": "b: 1\n"})
    (repo / "alias.yaml").symlink_to("fleet.yaml")
    _commit(repo)
    whole = gitrepo.revision_blob_ids(repo, "HEAD")
    asked = {"nodes/a.yaml", "alias.yaml", "conf.yaml", ".hidden/x.yaml", "missing.yaml"}
    # A directory asked for by name lists nothing; a hidden one is not read; a symlink is never read.
    assert gitrepo.revision_blob_ids(repo, "HEAD", asked) == {"nodes/a.yaml": whole["nodes/a.yaml"], "alias.yaml": None}
    assert gitrepo.revision_blob_ids(repo, "HEAD", set()) == {}
