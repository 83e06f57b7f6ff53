"""A git revision validated by an earlier run is not validated again (`checkedtrees`'s checked trees).

What a second run of the same commit reads from the store must give the
very LoadResult a full validation gives (the same problems in the same
order), and leave the memo so that head, read by delta from that base, is
validated right: a base whose problems a PR fixes must not keep them. Every
store entry that is damaged, foreign, of another shape or of other code is
a miss, answered by validating again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from desired import problems as p
from desired.state import LoadResult
from policies import validation, validationmemo
from reconciler import cli, sources
from reconciler.caches import blobpacks, checkedtrees, planresults
from tests.gitops.conftest import EXAMPLE, Repo

FORMATS = ("json", "markdown", "text")
S01_MAC = '"52:54:87:b3:44:81"'  # slot 0 of h200-use1-s01 (also in the conftest fleet)
S02_MAC = '"52:54:d1:f8:71:cf"'  # a slot of h200-use1-s02


@pytest.fixture
def broken_repo(tmp_path: Path) -> Iterator[Repo]:
    """The whole example fleet (warnings: unschedulable slots) with errors of the parse and of every cross-file kind."""
    root = tmp_path / "broken"
    shutil.copytree(EXAMPLE, root)
    repo = Repo(root, git.Repo.init(root, initial_branch="main"))
    repo.edit("nodes/h200-use1-s01.yaml", "admin_state: active", "admin_state: active\ncolour: blue")
    repo.edit("nodes/h200-euw1-s01.yaml", "region: eu-west-1", "region: eu-nowhere-1")
    repo.edit("slotmaps/h200-use1-s02.yaml", S02_MAC, S01_MAC)  # a MAC two slot maps share
    repo.commit("broken fleet")
    yield repo
    repo.repo.close()


def _reader(cache: Path) -> checkedtrees.Reader:
    """The Reader of a new command run with this cache dir."""
    return checkedtrees.open_reader(argparse.Namespace(no_cache=False, cache_dir=cache, state_dir=None))


def _rule_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every entry into the validation rules from now on (the memo's walks, its delta path, the full rules)."""
    runs: list[str] = []

    def spy(owner: Any, name: str) -> None:
        real = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            runs.append(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)

    spy(validationmemo.Memo, "_problems")
    spy(validationmemo.Memo, "_by_delta")
    spy(validation, "validate")
    return runs


def _same(got: LoadResult, want: LoadResult) -> None:
    assert got.problems == want.problems
    assert got.state.revision == want.state.revision


def _stored(cache: Path, root: Path, rev: str) -> tuple[blobpacks.DiskStore, str]:
    store = blobpacks.open_store(cache)
    assert store is not None
    return store, checkedtrees.checked_key(root, str(git.Repo(root).commit(rev).hexsha))


@pytest.mark.parametrize("tree", ["clean", "broken"])
def test_a_commit_checked_before_is_not_validated_again(
    tree: str, fleet_repo: Repo, broken_repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = (fleet_repo if tree == "clean" else broken_repo).root
    want = sources.load(root, "HEAD")  # the full rules, no memo, no cache
    if tree == "clean":
        assert not want.problems
    else:
        codes = {(x.code, x.severity) for x in want.problems}
        assert {
            (p.FIELD_UNKNOWN, p.Severity.ERROR),
            (p.REF_UNRESOLVED, p.Severity.ERROR),
            (p.SLOT_DUPLICATE_MAC, p.Severity.ERROR),
            (p.SLOT_UNSCHEDULABLE, p.Severity.WARNING),
        } <= codes
    cache = tmp_path / "cache"
    _same(_reader(cache).load(root, "HEAD"), want)
    runs = _rule_runs(monkeypatch)
    again = _reader(cache)
    _same(again.load(root, "HEAD"), want)
    assert runs == [] and again.memo.checked == 0
    if tree == "broken":  # the stored shared MACs are the tree's
        assert again.memo.owners == validationmemo._mac_owners(want.state.slot_maps) != {}


def test_gpuaas_validate_reads_a_checked_commit(
    broken_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def validate(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        rc = cli.main(["validate", str(broken_repo.root), "--rev", "HEAD", *args])
        return rc, capsys.readouterr().out

    for fmt in ("json", "text"):
        cache = str(tmp_path / f"cache-{fmt}")
        want = validate("-o", fmt, "--no-cache")
        assert want[0] == 1
        assert validate("-o", fmt, "--cache-dir", cache) == want
        runs = _rule_runs(monkeypatch)
        assert validate("-o", fmt, "--cache-dir", cache) == want
        assert runs == []
        monkeypatch.undo()


def _cases(repo: Repo) -> list[tuple[str, str, str]]:
    """(what, base, head) pairs, each head one commit after its base."""
    cases = []

    def pr(what: str, edit: Any) -> None:
        base = str(repo.repo.head.commit.hexsha)
        edit()
        cases.append((what, base, str(repo.repo.head.commit.hexsha)))

    pr("a clean base, a request", lambda: repo.request("req-a", 1))
    pr("a clean base, another request", lambda: repo.request("req-b", 2))

    def break_it() -> None:
        repo.edit("allocations/req-b.yaml", "gpu_count: 2", "gpu_count: 3")
        repo.commit("req-b asks for 3 GPUs")

    pr("head introduces an error", break_it)
    pr("base's error stays, a node drained", lambda: repo.drain("h200-use1-s02"))

    def fix_it() -> None:
        repo.edit("allocations/req-b.yaml", "gpu_count: 3", "gpu_count: 1")
        repo.commit("req-b asks for 1 GPU")

    pr("head fixes base's error", fix_it)

    def mac_shared() -> None:
        repo.edit("slotmaps/h200-use1-s02.yaml", S02_MAC, S01_MAC)
        repo.commit("s02 takes a MAC of s01")

    pr("head changes a slot map: a shared MAC", mac_shared)

    def mac_back() -> None:
        repo.edit("slotmaps/h200-use1-s02.yaml", S01_MAC, S02_MAC)
        repo.commit("s02's MAC is its own again")

    pr("head fixes a shared MAC in a slot map", mac_back)

    def drain() -> None:
        repo.drain("h200-use1-s01")

    pr("a clean base, a node drained", drain)

    def comment() -> None:
        repo.edit("nodes/h200-use1-s02.yaml", "admin_state:", "# reviewed\nadmin_state:")
        repo.commit("a comment: nothing to do")

    pr("a clean base, nothing changes", comment)
    return cases


def test_pr_plans_over_a_checked_base_equal_plans_without_a_cache(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        rc = cli.main([*args])
        return rc, capsys.readouterr().out

    readers: list[checkedtrees.Reader] = []
    real_open = checkedtrees.open_reader

    def open_reader(args: Any) -> checkedtrees.Reader:
        readers.append(real_open(args))
        return readers[-1]

    adopted: list[str | None] = []
    real_adopt = validationmemo.Memo.adopt

    def adopt(self: validationmemo.Memo, result: LoadResult, *args: Any) -> LoadResult:
        adopted.append(result.state.revision)  # None: set after, by the Reader
        return real_adopt(self, result, *args)

    monkeypatch.setattr(checkedtrees, "open_reader", open_reader)
    monkeypatch.setattr(validationmemo.Memo, "adopt", adopt)
    root = str(fleet_repo.root)
    exits = set()
    for n, (what, base, head) in enumerate(_cases(fleet_repo)):
        base_valid = not sources.load(fleet_repo.root, base).problems
        head_valid = not sources.load(fleet_repo.root, head).problems
        for fmt in FORMATS:
            flags = ("plan", root, "--offline", "--base", base, "--head", head, "-o", fmt, "--detailed-exitcode")
            want = run(*flags, "--no-cache")
            exits.add(want[0])
            cache = str(tmp_path / f"cache-{n}-{fmt}")  # holds base's checked tree only
            assert run("validate", root, "--rev", base, "--cache-dir", cache)[0] == (0 if base_valid else 1)
            del readers[:], adopted[:]
            assert run(*flags, "--cache-dir", cache) == want, (what, fmt)
            # Base was not validated, head was: by delta from a valid base, else by the whole rules
            # (a memo holding nothing, `validate_once`), whose answer it adopts as well.
            assert len(adopted) == (1 if base_valid else 2), what
            # A valid base is where head's validation by delta starts; a base with problems is not.
            (reader,) = readers
            assert reader.memo.by_delta == (base_valid and head_valid and "slot map" not in what), what
    assert exits == {0, 1, 2}


@pytest.mark.parametrize(
    "payload",
    [
        b"garbage",
        b"",
        b"[]",
        b'{"format": 1, "found": [], "owners": {}, "more": 1}',
        b'{"format": 2, "found": [], "owners": {}}',
        b'{"format": true, "found": [], "owners": {}}',
        b"[" * 100_000,
        b'{"format": 1, "found": [["c", "m", "f", "1", 1, "error"]], "owners": {}}',
        b'{"format": 1, "found": [["c", "m", "f", 1, 1, "fatal"]], "owners": {}}',
        b'{"format": 1, "found": [["c", "m", "f", 1, true, "error"]], "owners": {}}',
        b'{"format": 1, "found": [["c", "m", "f", 1, 1]], "owners": {}}',
        b'{"format": 1, "found": {}, "owners": {}}',
        b'{"format": 1, "found": [], "owners": {"52:54:00:00:00:01": [["n", 0]]}}',
        b'{"format": 1, "found": [], "owners": {"52:54:00:00:00:01": [["n", 0], ["m", "1"]]}}',
        b'{"format": 1, "found": [], "owners": []}',
    ],
)
def test_an_entry_of_another_shape_is_a_miss(
    payload: bytes, broken_repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert checkedtrees.decode(payload) is None
    root = broken_repo.root
    want = sources.load(root, "HEAD")
    cache = tmp_path / "cache"
    store, key = _stored(cache, root, "HEAD")
    store.put_record("results", key, payload)  # signed by this store: only its shape is wrong
    runs = _rule_runs(monkeypatch)
    _same(_reader(cache).load(root, "HEAD"), want)
    assert runs  # validated, and stored again
    del runs[:]
    _same(_reader(cache).load(root, "HEAD"), want)
    assert runs == []


@pytest.mark.parametrize("damage", ["payload", "mac", "key"])
def test_a_damaged_or_foreign_entry_is_a_miss(
    damage: str, broken_repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = broken_repo.root
    want = sources.load(root, "HEAD")
    cache = tmp_path / "cache"
    _same(_reader(cache).load(root, "HEAD"), want)
    if damage == "key":  # another user's (or a wiped) key: every entry is foreign
        (cache / "key").unlink()
    else:
        with sqlite3.connect(cache / "blobs.sqlite3") as db:
            if damage == "payload":  # claims the tree is clean
                db.execute("UPDATE results SET payload = ?", (checkedtrees.encode([], {}),))
            else:
                db.execute("UPDATE results SET mac = zeroblob(32)")
    runs = _rule_runs(monkeypatch)
    _same(_reader(cache).load(root, "HEAD"), want)
    assert runs


def test_other_code_or_another_path_is_a_miss(
    fleet_repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = fleet_repo.root
    cache = tmp_path / "cache"
    fleet_repo.edit("nodes/h200-use1-s01.yaml", "region: us-east-1", "region: us-nowhere-1")
    fleet_repo.commit("an unknown region")
    want = sources.load(root, "HEAD")
    assert want.errors
    _same(_reader(cache).load(root, "HEAD"), want)
    sub_want = sources.load(root / "nodes", "HEAD")
    runs = _rule_runs(monkeypatch)
    monkeypatch.setattr(planresults, "code_version", lambda: "another build")
    _same(_reader(cache).load(root, "HEAD"), want)
    assert runs.count("validate") == 1  # a fresh reader's memo holds nothing: the whole rules (`validate_once`)
    # A folder of the repo is another tree, though the commit is the same.
    sub = _reader(cache).load(root / "nodes", "HEAD")
    _same(sub, sub_want)
    assert runs.count("validate") == 2


def test_only_revisions_read_with_a_disk_store_are_kept(fleet_repo: Repo, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    reader = _reader(cache)
    reader.load(fleet_repo.root, None)  # the working tree: its files may differ from any commit
    store, key = _stored(cache, fleet_repo.root, "HEAD")
    assert store.get_record("results", key) is None
    reader.load(fleet_repo.root, "HEAD")
    stored = store.get_record("results", key)
    assert stored is not None and checkedtrees.decode(stored) == ([], {})
    assert json.loads(stored)["format"] == checkedtrees.FORMAT
