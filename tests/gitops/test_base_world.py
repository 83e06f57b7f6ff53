"""`gpuaas plan --offline` from a kept base world (`reconciler.caches.keptworlds`).

A plan whose base was kept by an earlier run must print exactly what a plan
from scratch prints and exit the same way, for every kind of change a PR can
make against that base: requests added, grown and released, nodes drained,
slot maps changed and withdrawn, the catalog and the Fleet edited, an
invalid head. It must read no slot map a change does not read, and a world
that is damaged, foreign, out of place or of other code is never used.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from reconciler import cli, sources
from reconciler.caches import blobpacks, cachestore, keptworlds, planresults
from reconciler.caches.lazymap import LazyMap
from tests.gitops.conftest import EXAMPLE, Repo

FORMATS = ("json", "markdown", "text")
S02_MAC = '"52:54:d1:f8:71:cf"'  # a slot of h200-use1-s02


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _child(repo: Repo, base: str, change: Callable[[Repo], object], message: str) -> str:
    """A commit whose parent is `base`, made by `change` (the checkout is left at base)."""
    repo.repo.git.checkout("--detach", base)
    change(repo)
    sha = repo.commit(message) if repo.repo.is_dirty(untracked_files=True) else repo.repo.head.commit.hexsha
    repo.repo.git.checkout("--detach", base)
    return str(sha)


def _heads(repo: Repo, base: str) -> dict[str, str]:
    """One PR per kind of change, each a child of base."""

    def edit(rel: str, old: str, new: str) -> Callable[[Repo], None]:
        return lambda r: r.edit(rel, old, new)

    def withdraw(r: Repo) -> None:
        r.remove("slotmaps/h200-use1-s02.yaml")

    return {
        "request": _child(repo, base, lambda r: r.request("req-new", 2), "a new request"),
        # a placed allocation cannot be edited (desired.allocation.immutable): the pending one changes size
        "grow": _child(repo, base, edit("allocations/req-d.yaml", "gpu_count: 8", "gpu_count: 4"), "req-d: 4 GPUs"),
        "release": _child(repo, base, lambda r: r.release("req-c"), "req-c released: req-d fits"),
        "drain": _child(repo, base, lambda r: r.drain("h200-use1-s01"), "s01 drained"),
        "mac": _child(repo, base, edit("slotmaps/h200-use1-s02.yaml", S02_MAC, '"52:54:d1:f8:71:ce"'), "a MAC"),
        "withdraw": _child(repo, base, withdraw, "s02 slot map withdrawn"),
        "sku": _child(repo, base, edit("skus/h200-sxm-slice.yaml", "[1, 2, 4, 8]", "[1, 2, 4]"), "no 8-GPU slices"),
        "fleet": _child(repo, base, edit("fleet.yaml", "policy: default", "policy: first-fit"), "first fit"),
        "invalid": _child(repo, base, edit("allocations/req-b.yaml", "gpu_count: 2", "gpu_count: 3"), "3 GPUs"),
        "same": base,
        "behind": str(repo.repo.commit(base).parents[0].hexsha),  # not a descendant: head is read whole
    }


@pytest.fixture
def based(fleet_repo: Repo) -> tuple[Repo, str]:
    """The two-node fleet with three requests placed and one pending: the base every PR here is planned against."""
    for allocation_id, gpus in (("req-a", 1), ("req-b", 2), ("req-c", 8)):
        fleet_repo.request(allocation_id, gpus)
    return fleet_repo, fleet_repo.request("req-d", 8)  # no node has 8 free GPUs left


def _worlds(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("world-*") if not p.name.endswith(".tmp"))


def _used(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per plan with the cache on, from now on: was a kept world restored?"""
    used: list[bool] = []
    real = keptworlds.get

    def spy(store: Any, *args: Any) -> Any:
        world = real(store, *args)
        if store is not None:
            used.append(world is not None)
        return world

    monkeypatch.setattr(keptworlds, "get", spy)
    return used


def _keep_world(capsys: pytest.CaptureFixture[str], root: Path, base: str, head: str, cache: Path) -> None:
    """Plan base twice (a second sighting keeps its world; two formats, so the second is not a replay)."""
    for fmt in ("text", "markdown"):
        _run(capsys, str(root), "--offline", "--base", base, "--head", head, "-o", fmt, "--cache-dir", str(cache))
    assert len(_worlds(cache)) == 1


def test_plans_from_a_kept_base_equal_plans_from_scratch(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    root = str(repo.root)
    _keep_world(capsys, repo.root, base, heads["request"], cache)
    used = _used(monkeypatch)
    rcs = set()
    for kind, head in heads.items():
        for fmt in FORMATS:
            flags = ("--offline", "--base", base, "--head", head, "-o", fmt, "--detailed-exitcode", "--fail-on-pending")
            want = _run(capsys, root, *flags, "--no-cache")
            rcs.add(want[0])
            got = _run(capsys, root, *flags, "--cache-dir", str(cache))
            assert got == want, (kind, fmt)
    # every plan restored the world (the plans of the two formats `_keep_world` ran are replays)
    assert used == [True] * (len(heads) * len(FORMATS) - 2)
    assert rcs >= {0, 1, 2}


def test_a_plan_reads_only_the_files_its_change_reads(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    monkeypatch.setattr(keptworlds, "CHUNK", 1)  # each file its own pickle: a load is a file read
    _keep_world(capsys, repo.root, base, heads["same"], cache)
    files = len(sources.load(repo.root, base).state.sources)  # one document per file here
    loads: list[int] = []
    real = keptworlds._loads
    monkeypatch.setattr(keptworlds, "_loads", lambda data, *rest: (loads.append(1), real(data, *rest))[1])
    read: dict[str, int] = {}
    for kind in ("request", "grow", "release", "drain", "mac"):
        loads.clear()
        flags = ("--offline", "--base", base, "--head", heads[kind], "-o", "json", "--cache-dir", str(cache))
        _run(capsys, str(repo.root), *flags)
        read[kind] = len(loads)  # one load per file read (the core is unpickled from the mapped file)
    assert read == {
        "request": 1,  # the last allocation's file: a new one goes after it in file order
        "grow": 1,  # the file it edits
        "release": 2,  # the file it removes, the slot map of the node it frees (its slots go to cleanup)
        "drain": 2,  # the node's file, its slot map (the node's slot facts are made again)
        "mac": files,  # a MAC edit validates every slot map against every node: everything is read
    }


@pytest.mark.parametrize("damage", ["core", "index", "mac", "size", "symlink", "missing", "key", "code"])
def test_a_damaged_foreign_or_stale_world_is_not_used(
    based: tuple[Repo, str],
    tmp_path: Path,
    damage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    _keep_world(capsys, repo.root, base, heads["grow"], cache)
    (world,) = _worlds(cache)
    data = world.read_bytes()
    if damage in ("core", "index"):  # what the store's HMAC covers: the core, or a file's place and digest
        at = 200 if damage == "core" else keptworlds._signed(data) - 40
        world.write_bytes(data[:at] + bytes(b ^ 1 for b in data[at : at + 8]) + data[at + 8 :])
    elif damage == "mac":
        with sqlite3.connect(cache / cachestore.DB_NAME) as db:
            db.execute("UPDATE worlds SET mac = zeroblob(32)")
    elif damage == "size":
        world.write_bytes(data + b"\0")
    elif damage == "symlink":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_bytes(data)
        world.unlink()
        world.symlink_to(elsewhere)
    elif damage == "missing":
        world.unlink()
    elif damage == "key":  # another user's (or a wiped) key: the world is foreign
        (cache / "key").unlink()
    else:  # other code: another key, never this world
        monkeypatch.setattr(planresults, "code_version", lambda: "another build")
    used = _used(monkeypatch)
    flags = (str(repo.root), "--offline", "--base", base, "--head", heads["request"], "-o", "json")
    want = _run(capsys, *flags, "--no-cache")
    assert _run(capsys, *flags, "--cache-dir", str(cache)) == want
    assert used == [False]


def test_a_world_is_kept_only_when_a_base_is_planned_again_and_the_newest_two_stay(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    root = str(repo.root)
    _run(capsys, root, "--offline", "--base", base, "--head", heads["grow"], "--no-cache")
    assert not cache.exists()
    _run(capsys, root, "--offline", "--base", base, "--head", heads["grow"], "--cache-dir", str(cache))
    assert _worlds(cache) == []  # first sighting: the base's checked tree is stored, no world
    bases = [base, heads["drain"], heads["release"]]
    for b in bases:
        for head in (heads["grow"], heads["request"]):  # two plans against each base
            _run(capsys, root, "--offline", "--base", b, "--head", head, "--cache-dir", str(cache))
    kept = {p.name.removeprefix("world-") for p in _worlds(cache)}
    assert kept == {keptworlds.key(repo.root, b, None) for b in bases[1:]}
    with sqlite3.connect(cache / cachestore.DB_NAME) as db:
        assert {k for (k,) in db.execute("SELECT key FROM worlds")} == kept


def test_no_world_is_kept_for_an_invalid_base(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    for _ in range(3):
        _run(
            capsys,
            str(repo.root),
            "--offline",
            "--base",
            heads["invalid"],
            "--head",
            heads["request"],
            "--cache-dir",
            str(cache),
        )
    assert _worlds(cache) == []


@pytest.fixture
def example_repo(tmp_path: Path) -> Iterator[Repo]:
    """The whole example fleet: its base has warnings (unschedulable slots), so head is validated whole."""
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root)
    repo = Repo(root, git.Repo.init(root, initial_branch="main"))
    repo.commit("example fleet")
    yield repo
    repo.repo.close()


def test_a_base_with_warnings_is_kept_and_plans_equal(
    example_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = str(example_repo.repo.head.commit.hexsha)
    assert sources.load(example_repo.root, base).warnings  # the case this test is about
    heads = [_child(example_repo, base, lambda r, n=n: r.request(f"req-{n}", n), f"{n} GPUs") for n in (1, 2, 4)]
    cache = tmp_path / "cache"
    _keep_world(capsys, example_repo.root, base, heads[0], cache)
    used = _used(monkeypatch)
    for head in heads:
        flags = (str(example_repo.root), "--offline", "--base", base, "--head", head, "-o", "json")
        want = _run(capsys, *flags, "--no-cache")
        assert _run(capsys, *flags, "--cache-dir", str(cache)) == want
    assert used == [True] * len(heads)


def test_a_world_file_is_private(based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    _keep_world(capsys, repo.root, base, heads["grow"], cache)
    (world,) = _worlds(cache)
    st = os.stat(world)
    assert st.st_mode & 0o077 == 0 and st.st_uid == os.geteuid()
    assert not list(cache.glob("*.tmp"))


@pytest.fixture
def bundled(tmp_path: Path) -> Iterator[tuple[Repo, str]]:
    """The whole example fleet laid out otherwise: two slot maps in one file (kept lazily, as one file),
    a node and its slot map in one file (kept eagerly), the rest one document per file."""
    root = tmp_path / "bundled"
    shutil.copytree(EXAMPLE, root)
    slotmaps = root / "slotmaps"
    both = [(slotmaps / f"{n}.yaml").read_text() for n in ("h200-use1-s02", "h200-euw1-s01")]
    (slotmaps / "pair.yaml").write_text("---\n".join(both))
    node = (root / "nodes/h200-use1-c01.yaml").read_text()
    (root / "nodes/c01-with-slots.yaml").write_text(node + "\n---\n" + (slotmaps / "h200-use1-c01.yaml").read_text())
    for gone in (
        "slotmaps/h200-use1-s02.yaml",
        "slotmaps/h200-euw1-s01.yaml",
        "slotmaps/h200-use1-c01.yaml",
        "nodes/h200-use1-c01.yaml",
    ):
        (root / gone).unlink()
    repo = Repo(root, git.Repo.init(root, initial_branch="main"))
    repo.commit("bundled fleet")
    repo.request("req-a", 2)
    yield repo, repo.request("req-b", 4)
    repo.repo.close()


def test_files_holding_several_documents_are_kept_and_plan_equal(
    bundled: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, base = bundled
    assert not sources.load(repo.root, base).errors
    heads = {
        "request": _child(repo, base, lambda r: r.request("req-new", 1), "a request"),
        "paired-mac": _child(
            repo,
            base,
            lambda r: r.edit("slotmaps/pair.yaml", S02_MAC, '"52:54:d1:f8:71:ce"'),
            "a MAC in the paired file",
        ),
        "bundled-drain": _child(
            repo,
            base,
            lambda r: r.edit("nodes/c01-with-slots.yaml", "admin_state: active", "admin_state: draining"),
            "c01 drained",
        ),
        "release": _child(repo, base, lambda r: r.release("req-b"), "req-b released"),
    }
    cache = tmp_path / "cache"
    _keep_world(capsys, repo.root, base, heads["request"], cache)
    used = _used(monkeypatch)
    for kind, head in heads.items():
        flags = (str(repo.root), "--offline", "--base", base, "--head", head, "-o", "json", "--detailed-exitcode")
        want = _run(capsys, *flags, "--no-cache")
        assert _run(capsys, *flags, "--cache-dir", str(cache)) == want, kind
    assert used == [True] * len(heads)
    # how it was kept: every file apart, read when first asked for; its models are the state's own
    store = blobpacks.open_store(cache)
    world = keptworlds.get(store, keptworlds.key(repo.root, base, None), None)
    assert world is not None
    state, files = world.state, world.tree.by_path
    maps, found = state.slot_maps, state.sources
    assert isinstance(maps, LazyMap) and isinstance(files, LazyMap) and isinstance(found, LazyMap)
    assert (maps.loaded(), files.loaded(), found.loaded()) == (0, 0, 0)
    s02 = maps["h200-use1-s02"]
    assert (maps.loaded(), files.loaded()) == (1, 1) and maps["h200-use1-s02"] is s02
    assert [model for _, model, _ in files["slotmaps/pair.yaml"].docs] == [s02, maps["h200-euw1-s01"]]
    assert files["slotmaps/pair.yaml"].docs[0][1] is s02 and files.loaded() == 1
    # the mixed file: its node is the state's Node itself, its slot map the one the state's table gives
    (node_doc, node, _), (_, c01_map, _) = files["nodes/c01-with-slots.yaml"].docs
    assert node is state.nodes["h200-use1-c01"] and c01_map is maps["h200-use1-c01"]
    source = found[("Node", "h200-use1-c01")]
    assert source.doc is node_doc and source.model_id == id(node) and found[("Node", "h200-use1-c01")] is source
    assert files.loaded() == 2
    store.close()


def test_a_world_file_no_row_names_is_removed_when_the_next_is_kept(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    stray = cache / f"world-{'0' * 64}"  # a run killed between writing its file and its row
    stray.write_bytes(b"left behind")
    writing = cache / f"world-{'1' * 64}.123.tmp"  # another run's write in progress
    writing.write_bytes(b"being written")
    _keep_world(capsys, repo.root, base, heads["grow"], cache)
    assert not stray.exists() and writing.exists()


def test_a_plan_from_a_kept_base_starts_no_gitpython(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refs and the PR's changes are read from the repository's files (`desired.reading.gitobjects`)."""
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    _keep_world(capsys, repo.root, base, heads["same"], cache)
    repo.repo.git.pack_refs("--all")  # the branch names are read from packed-refs
    repo.repo.git.gc("-q", "--prune=now")  # and the objects from packs
    flags = (str(repo.root), "--offline", "--base", "main", "--head", heads["request"], "-o", "json")
    want = _run(capsys, *flags, "--no-cache")

    def no_gitpython(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("GitPython was asked")

    monkeypatch.setattr(git, "Repo", no_gitpython)
    used = _used(monkeypatch)
    assert _run(capsys, *flags, "--cache-dir", str(cache)) == want
    assert used == [True]


def test_a_file_of_a_world_damaged_after_its_check_is_found_and_planned_without(
    based: tuple[Repo, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's bytes are checked when the plan reads them (`cachefiles.SignedFile.read_checked`)."""
    repo, base = based
    heads = _heads(repo, base)
    cache = tmp_path / "cache"
    _keep_world(capsys, repo.root, base, heads["grow"], cache)
    (world,) = _worlds(cache)
    data = world.read_bytes()
    signed = keptworlds._signed(data)
    world.write_bytes(data[:signed] + bytes(b ^ 1 for b in data[signed:]))  # every file, none of the signed head
    used = _used(monkeypatch)
    flags = (str(repo.root), "--offline", "--base", base, "--head", heads["request"], "-o", "json")
    want = _run(capsys, *flags, "--no-cache")
    rc, out, err = _run(capsys, *flags, "--cache-dir", str(cache))
    assert (rc, out) == want[:2] and "kept base not used" in err and "does not match its digest" in err
    assert used == [True]  # restored (its head checks out), then a file it read did not
    # the damaged world was removed, and the plan made without it kept base again: every file reads back
    store = blobpacks.open_store(cache)
    again_world = keptworlds.get(store, keptworlds.key(repo.root, base, None), None)
    assert again_world is not None and all(blob.docs for blob in again_world.tree.by_path.values())
    store.close()
    flags = (str(repo.root), "--offline", "--base", base, "--head", heads["release"], "-o", "json")
    again = _run(capsys, *flags, "--cache-dir", str(cache))
    assert again == _run(capsys, *flags, "--no-cache") and used[-1] is True
