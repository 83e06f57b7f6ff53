"""A revision read by delta (`gitrepo.read_revision` with a kept tree) equals a whole read.

Random edit sequences on a git repo holding examples/fleet (the edits of
test_incremental_validation, plus directories renamed and removed, new
files that sort before or after every other, documents moved between
files), one commit each. After every commit the state read from the kept
tree and `git diff-tree` equals a whole read from nothing: the same tables
in the same order, the same sources, the same problems, FILE:LINE:COL, in
order. Cross-file validation runs incrementally (`validationmemo.Memo`).
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from desired.reading import gitrepo, loading
from desired.state import LoadResult
from policies import validation, validationmemo
from reconciler.caches.blobs import BlobCache
from tests.desired.test_incremental_validation import EXAMPLE, _edit, _rendered

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "PATH": "/usr/bin:/bin",
}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True, env=_GIT_ENV
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    _git(root, "init", "-q", "-b", "main")
    _commit(root)
    return root


def _commit(root: Path) -> None:
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "--allow-empty", "-m", "edit")


def _move_things(rng: random.Random, root: Path) -> None:
    """Directories renamed or removed, files that sort first or last, a document moved between files."""
    dirs = sorted(d for d in root.rglob("*") if d.is_dir() and ".git" not in d.parts)
    what = rng.randrange(4)
    if what == 0 and dirs:
        d = rng.choice(dirs)
        dest = d.with_name(rng.choice(["aa-first", "zz-last", d.name + "-moved"]))
        if not dest.exists():
            d.rename(dest)
    elif what == 1 and dirs and rng.random() < 0.3:
        shutil.rmtree(rng.choice(dirs))
    elif what == 2:
        files = sorted(root.rglob("*.yaml"))
        if files:
            src = rng.choice(files)
            src.rename(root / rng.choice(["0-first.yaml", "zz/last.yaml", "m/middle.yaml"]).replace("/", "-"))
    else:  # two documents into one file (and later, perhaps, apart again)
        files = sorted(root.rglob("*.yaml"))
        if len(files) > 2:
            a, b = rng.sample(files, 2)
            a.write_text(a.read_text().rstrip("\n") + "\n---\n" + b.read_text())
            b.unlink()


def _shape(result: LoadResult) -> dict[str, Any]:
    s = result.state
    return {
        "fleet": s.fleet,
        "file_count": s.file_count,
        **{attr: list(getattr(s, attr).items()) for attr in ("skus", "images", "nodes", "slot_maps", "allocations")},
        "sources": sorted((k, v.file, v.line, v.doc.index) for k, v in s.sources.items()),
        "problems": _rendered(result),
    }


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_revision_read_by_delta_equals_a_whole_read_after_every_commit(repo: Path, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test randomness
    pool = sorted(EXAMPLE.rglob("*.yaml"))
    # as `gpuaas run` holds it (odd seeds): no plain values kept, positions come from the bytes
    cache, memo = BlobCache(keep_values=seed % 2 == 0), validationmemo.Memo()
    by_delta = 0
    for _ in range(60):
        roll = rng.random()
        if roll < 0.15:  # back to a tree without parse problems: the next commits can go by delta
            for path in repo.iterdir():
                if path.name != ".git":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            shutil.copytree(EXAMPLE, repo, dirs_exist_ok=True)
        elif roll < 0.4:
            _move_things(rng, repo)
        else:
            _edit(rng, repo, pool)
        _commit(repo)
        warm = memo.validate(gitrepo.read_revision(repo, "HEAD", cache=cache))
        cold = validation.validate(loading.parse_refs(gitrepo.revision_refs(repo, "HEAD")))
        assert _shape(warm) == _shape(cold)
        by_delta += warm.delta is not None
    assert memo.fallbacks == 0
    assert by_delta >= 10  # the delta path did run (edits that leave parse problems read whole)
    assert memo.by_delta >= 1  # and validation by delta too


def test_a_revision_that_does_not_descend_from_the_kept_one_is_read_whole(repo: Path) -> None:
    cache = BlobCache()
    gitrepo.read_revision(repo, "HEAD", cache=cache)
    first = _git(repo, "rev-parse", "HEAD")
    (repo / "nodes" / "extra.yaml").write_text(
        (next((repo / "nodes").glob("*.yaml"))).read_text().replace("name: ", "name: x", 1)
    )
    _commit(repo)
    ahead = gitrepo.read_revision(repo, "HEAD", cache=cache)
    assert ahead.delta is not None and cache.last_full == ""
    back = gitrepo.read_revision(repo, first, cache=cache)  # a rollback: an ancestor, not a descendant
    assert back.delta is None
    assert "does not descend" in cache.last_full
    cold = loading.parse_refs(gitrepo.revision_refs(repo, first))
    assert _shape(back) == _shape(cold)


def test_a_delta_names_exactly_the_documents_that_changed(repo: Path) -> None:
    cache = BlobCache()
    before = gitrepo.read_revision(repo, "HEAD", cache=cache)
    blobs = len(cache)
    node = sorted((repo / "nodes").glob("*.yaml"))[0]
    node.write_text(node.read_text() + "\n")  # same document, other bytes: a new model object
    _commit(repo)
    after = gitrepo.read_revision(repo, "HEAD", cache=cache)
    delta = after.delta
    assert delta is not None and delta.base() is before.state
    (name,) = delta.names("Node")
    assert delta.keys == {("Node", name)}
    assert after.state.nodes[name] is not before.state.nodes[name]
    assert all(after.state.slot_maps[k] is v for k, v in before.state.slot_maps.items())
    assert list(after.state.nodes) == list(before.state.nodes)  # replaced where it stood
    assert len(cache) == blobs  # a delta's blobs live in the kept tree: commits pile nothing up by blob id


def test_validation_of_a_clean_delta_checks_only_the_changed_node_and_its_slot_map(repo: Path) -> None:
    """Other documents' problems (the example's slot warnings) stay as they were, in their order."""
    cache, memo = BlobCache(), validationmemo.Memo()
    first = memo.validate(gitrepo.read_revision(repo, "HEAD", cache=cache))
    assert first.problems and not first.errors
    node = next(
        n
        for n in sorted((repo / "nodes").glob("*.yaml"))
        if (repo / "slotmaps" / n.name).exists()
        and not any(x.file in (f"nodes/{n.name}", f"slotmaps/{n.name}") for x in first.problems)
    )
    node.write_text(node.read_text() + "\n")
    _commit(repo)
    warm = memo.validate(gitrepo.read_revision(repo, "HEAD", cache=cache))
    assert (memo.by_delta, memo.checked) == (1, 2)  # the node, and its slot map (it reads the node)
    assert _shape(warm) == _shape(validation.validate(loading.parse_refs(gitrepo.revision_refs(repo, "HEAD"))))
    # A change that breaks a rule: the delta check finds it, the walk orders it; the same as a whole run.
    node.write_text(node.read_text().replace("region: ", "region: mars-", 1))
    _commit(repo)
    broken = memo.validate(gitrepo.read_revision(repo, "HEAD", cache=cache))
    assert broken.problems and memo.by_delta == 1
    assert _shape(broken) == _shape(validation.validate(loading.parse_refs(gitrepo.revision_refs(repo, "HEAD"))))
