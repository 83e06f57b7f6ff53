"""`gitrepo.resolve`: a full commit id is asked of git once per process; a ref is asked every time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git
import pytest

from desired.reading import gitrepo


def _commit(repo: git.Repo, root: Path, text: str) -> str:
    (root / "a.yaml").write_text(text)
    repo.index.add(["a.yaml"])
    return str(repo.index.commit(text, author=git.Actor("t", "t@example.org")).hexsha)


def test_a_commit_id_is_resolved_once_and_a_ref_each_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = git.Repo.init(tmp_path)
    first = _commit(repo, tmp_path, "one")
    assert gitrepo.resolve(tmp_path, first) == first

    opened: list[Any] = []
    real = git.Repo

    def counting(*args: Any, **kwargs: Any) -> git.Repo:
        opened.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(git, "Repo", counting)
    assert gitrepo.resolve(tmp_path, first) == first
    assert opened == []  # known: git is not asked again

    second = _commit(repo, tmp_path, "two")
    assert gitrepo.resolve(tmp_path, "HEAD") == second  # a ref moves: read again every time
    assert opened == []  # from the repository's files (desired.reading.gitobjects), not GitPython
    assert gitrepo.resolve(tmp_path, first[:12]) == first  # a short id may name another object later
    assert len(opened) == 1  # git's rules for short ids: asked of GitPython, every time
    third = _commit(repo, tmp_path, "three")
    assert gitrepo.resolve(tmp_path, "HEAD") == third


def test_an_unknown_commit_id_is_still_refused(tmp_path: Path) -> None:
    repo = git.Repo.init(tmp_path)
    _commit(repo, tmp_path, "one")
    for _ in range(2):  # a failure is never remembered as an answer
        with pytest.raises(gitrepo.RevisionError):
            gitrepo.resolve(tmp_path, "1" * 40)
