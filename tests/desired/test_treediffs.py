"""`treediffs.diff` answers what `git diff-tree -r -z --no-renames A B -- PREFIX` answers.

One repo, one commit per kind of change a tree can see: files added,
changed and removed, a mode change, a file that becomes a folder and back,
a symlink, a folder removed whole, a nested folder added; each pair compared
against git itself, over the whole tree and under a prefix.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import git
import pytest

from desired.reading import treediffs
from tests.desired.test_deltas import _git


def _git_says(root: Path, a: str, b: str, prefix: str) -> list[treediffs.Change]:
    out = _git(root, "diff-tree", "-r", "-z", "--no-renames", a, b, "--", *([prefix] if prefix else []))
    parts = out.split("\0")
    got = []
    for meta, path in zip(parts[0::2], parts[1::2], strict=False):
        old_mode, new_mode, _, new_id, _ = meta[1:].split(" ")
        got.append(treediffs.Change(old_mode, new_mode, new_id, path))
    return got


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _gone(root: Path, rel: str) -> None:
    path = root / rel
    if path.is_dir():
        subprocess.run(["rm", "-r", "--", str(path)], check=True)
    else:
        path.unlink()


STEPS = [
    [("w", "a.yaml", "1"), ("w", "b/c.yaml", "2"), ("w", "b/d/e.yaml", "3"), ("w", "z.yaml", "4")],
    [("w", "a.yaml", "1 changed"), ("w", "b/new.yaml", "5"), ("r", "z.yaml", "")],
    [("x", "b/c.yaml", ""), ("w", "b.c.yaml", "6")],
    [("r", "a.yaml", ""), ("w", "a.yaml/inner.yaml", "7")],  # a file becomes a folder
    [("r", "a.yaml", ""), ("w", "a.yaml", "8")],  # and back
    [("l", "b/link.yaml", "c.yaml"), ("w", "q/r/s/t.yaml", "9")],
    [("r", "b", "")],  # a folder removed whole
    [("w", "b/d/e.yaml", "3")],  # and a nested one put back
]


@pytest.mark.parametrize("prefix", ["", "b"])
def test_each_change_kind_equals_git_diff_tree(tmp_path: Path, prefix: str) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    commits: list[str] = []
    for step in STEPS:
        for op, rel, text in step:
            if op == "w":
                _write(root, rel, text)
            elif op == "r":
                _gone(root, rel)
            elif op == "x":
                (root / rel).chmod(0o755)
            else:
                os.symlink(text, root / rel)
        _git(root, "add", "-A")
        _git(root, "commit", "-q", "--allow-empty", "-m", "step")
        commits.append(_git(root, "rev-parse", "HEAD"))
    with git.Repo(root) as repo:
        for a, b in [*itertools.pairwise(commits), (commits[0], commits[-1]), (commits[-1], commits[0])]:
            assert treediffs.diff(repo, a, b, prefix) == _git_says(root, a, b, prefix), (a, b)
