"""Refs and trees read from a repository's files (`desired.reading.gitobjects`) agree with git itself.

Every answer is checked against real git on real repositories: refs loose,
packed and symbolic, tags, a linked worktree, packed objects with deltas,
and the repositories this module must leave to git.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from desired.reading import gitobjects, gitrepo


def _commit(repo: git.Repo, files: dict[str, str | None], message: str) -> str:
    root = Path(repo.working_tree_dir or "")
    for rel, text in files.items():
        path = root / rel
        if text is None:
            repo.git.rm("-r", "-q", "--", rel)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        repo.git.add("--", rel)
    repo.git.commit("-q", "--allow-empty", "-m", message)
    return str(repo.head.commit.hexsha)


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[git.Repo]:
    r = git.Repo.init(tmp_path / "repo", initial_branch="main")
    with r.config_writer() as c:
        c.set_value("user", "name", "t")
        c.set_value("user", "email", "t@example.com")
    yield r
    r.close()


def _rev_parse(repo: git.Repo, name: str) -> str:
    return str(repo.git.rev_parse("--verify", "-q", f"{name}^{{commit}}"))


def _refs_repo(repo: git.Repo) -> tuple[str, str]:
    """main at c2; feature, tags, a remote and its symbolic HEAD; refs packed, then some loose again."""
    c1 = _commit(repo, {"a.yaml": "a: 1\n"}, "c1")
    c2 = _commit(repo, {"a.yaml": "a: 2\n"}, "c2")
    repo.git.branch("feature", c2)
    repo.git.tag("light", c1)
    repo.git.tag("-a", "v1", "-m", "annotated", c1)
    repo.git.tag("both", c1)  # a tag and a branch of one name: git takes the tag
    repo.git.branch("both", c2)
    repo.git.update_ref("refs/remotes/origin/main", c1)
    repo.git.symbolic_ref("refs/remotes/origin/HEAD", "refs/remotes/origin/main")
    repo.git.pack_refs("--all")
    repo.git.update_ref("refs/heads/feature", c1)  # a loose ref over its packed value wins
    repo.git.branch("loose", c2)
    return c1, c2


NAMES = (
    "HEAD",
    "main",
    "both",
    "feature",
    "loose",
    "light",
    "v1",
    "tags/v1",
    "origin/main",
    "origin",
    "refs/heads/main",
)


def test_refs_resolve_as_git_resolves_them(repo: git.Repo) -> None:
    c1, c2 = _refs_repo(repo)
    root = Path(repo.working_tree_dir or "")
    fast = gitobjects.open_repo(root / "sub" / "dir")  # found from a folder below the top, as git finds it
    assert fast is not None
    for name in (*NAMES, c1, c2):
        assert fast.commit(name) == _rev_parse(repo, name), name
    repo.git.checkout("-q", "--detach", c1)
    assert fast.commit("HEAD") == c1
    assert fast.commit("nosuch") is None


@pytest.mark.parametrize("rev", ["HEAD~1", "main^", "main@{0}", "v1^{commit}", "SHORT", "deadbeef", "main:a.yaml"])
def test_what_is_not_read_here_is_left_to_git(repo: git.Repo, rev: str) -> None:
    c1, _ = _refs_repo(repo)
    root = Path(repo.working_tree_dir or "")
    rev = c1[:7] if rev == "SHORT" else rev
    fast = gitobjects.open_repo(root)
    assert fast is not None and fast.commit(rev) is None
    if rev in ("deadbeef", "main:a.yaml"):  # no such commit / not a commit: git says so
        with pytest.raises(gitrepo.RevisionError):
            gitrepo.resolve(root, rev)
    else:
        assert gitrepo.resolve(root, rev) == _rev_parse(repo, rev)


def test_a_linked_worktree_reads_its_own_head_and_the_shared_refs(repo: git.Repo, tmp_path: Path) -> None:
    c1, c2 = _refs_repo(repo)
    other = tmp_path / "other"
    repo.git.worktree("add", "-q", "--detach", str(other), c1)
    fast = gitobjects.open_repo(other)
    assert fast is not None and fast.top == other and fast.common == Path(repo.git_dir).resolve()
    assert fast.commit("HEAD") == c1 and gitrepo.head(other) == c1
    assert fast.commit("main") == c2 and fast.commit("origin") == c1
    assert gitrepo.head(Path(repo.working_tree_dir or "")) == c2


@pytest.mark.parametrize("unusual", ["shallow", "replace", "env", "core.worktree", "bare", "include"])
def test_unusual_repositories_are_left_to_git(repo: git.Repo, unusual: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c1, c2 = _refs_repo(repo)
    root = Path(repo.working_tree_dir or "")
    gitdir = Path(repo.git_dir)
    if unusual == "shallow":
        (gitdir / "shallow").write_text(c1 + "\n")
    elif unusual == "replace":
        repo.git.replace(c2, c1)
    elif unusual == "env":
        monkeypatch.setenv("GIT_DIR", str(gitdir))
    else:
        key = {"core.worktree": ("core.worktree", str(root)), "bare": ("core.bare", "false"), "include": None}[unusual]
        if key is None:
            repo.git.config("include.path", "elsewhere.cfg")
        else:
            repo.git.config(*key)
    if unusual == "bare":  # core.bare=false is plain: it is read here
        assert gitobjects.open_repo(root) is not None
        return
    assert gitobjects.open_repo(root) is None
    assert gitrepo.resolve(root, "main") == _rev_parse(repo, "main")


def _diff_tree(repo: git.Repo, old: str, new: str, prefix: str = "") -> list[tuple[str, ...]]:
    out = repo.git.diff_tree("-r", "-z", "--no-renames", old, new, "--", *([prefix] if prefix else []))
    parts = out.split("\0")
    return [
        (*meta[1:].split(" ")[:4], path)
        for meta, path in zip(parts[0::2], parts[1::2], strict=False)
        if meta.startswith(":")
    ]


def test_tree_differences_and_packed_objects_read_as_git_reads_them(repo: git.Repo) -> None:
    root = Path(repo.working_tree_dir or "")
    body = "".join(f"slot-{i}: {i}\n" for i in range(200))  # similar blobs: packed as deltas
    old = _commit(
        repo,
        {
            "fleet.yaml": "fleet: 1\n",
            "nodes/n1.yaml": body,
            "nodes/n2.yaml": body + "x: 1\n",
            "nodes/deep/n3.yaml": body,
            "x": "a file that becomes a folder\n",
            "a.b": "sorts between a and a/\n",
            "a/inside.yaml": "a: 1\n",
            "gone/only.yaml": "bye\n",
        },
        "old",
    )
    new = _commit(
        repo,
        {
            "nodes/n1.yaml": body + "changed: true\n",
            "nodes/deep/n4.yaml": body + "new: 1\n",
            "x": None,
            "x/y.yaml": "now a folder\n",
            "gone/only.yaml": None,
            "a/inside.yaml": "a: 2\n",
            "zz.yaml": "added\n",
        },
        "new",
    )
    (root / "script.sh").write_text("#!/bin/sh\n")
    (root / "script.sh").chmod(0o755)
    (root / "link.yaml").symlink_to("fleet.yaml")
    repo.git.add("-A")
    newest = _commit(repo, {}, "modes")
    repo.git.gc("-q", "--aggressive", "--prune=now")  # every object packed, most as deltas
    assert not any((Path(repo.git_dir) / "objects").glob("??/*"))
    fast = gitobjects.open_repo(root)
    assert fast is not None
    for a, b in ((old, new), (new, old), (new, newest), (old, newest)):
        ta, tb = fast.tree_of(a), fast.tree_of(b)
        assert ta is not None and tb is not None
        for prefix in ("", "nodes", "nodes/deep", "x", "a"):
            assert fast.diff(ta, tb, prefix) == _diff_tree(repo, a, b, prefix), (a, b, prefix)
    assert fast.parents(newest) == [new] and fast.is_ancestor(old, newest) and not fast.is_ancestor(newest, old)
    assert fast.holds(fast.tree_of(new) or "", "nodes/deep") and not fast.holds(fast.tree_of(new) or "", "x.yaml")
    for line in repo.git.ls_tree("-r", newest).splitlines():
        meta, _ = line.split("\t", 1)
        sha = meta.split(" ")[2]
        got = fast.read(sha)
        assert got is not None and got[0] == "blob"
        assert got[1] == repo.git.cat_file("blob", sha, stdout_as_string=False, strip_newline_in_stdout=False)
