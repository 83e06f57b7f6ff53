"""The plan cache's trust never comes from the tree being planned (issue 27).

A pull request can commit a `.gpuaas/cache` holding its own HMAC key and a
pack that pairs the bytes of an invalid allocation with the typed model of a
valid one. CI runs `gpuaas plan` from the checkout root; whatever the
runner's umask made of the committed files, the plan must print and exit
exactly as without any cache.
"""

from __future__ import annotations

import os
import pickle
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from desired.reading import loading
from desired.state import Source
from reconciler import cli, settings
from reconciler.caches import blobpacks, cachefiles, cachestore, keptworlds
from tests.gitops.conftest import PEOPLE, Repo, make_fleet

EVIL = "allocations/req-evil.yaml"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["plan", *args])
    return rc, capsys.readouterr().out


def _err(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    cli.main(["plan", *args])
    return capsys.readouterr().err


def _allocation(tenant: str) -> bytes:
    return (
        f'apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: req-evil\ntenant: "{tenant}"\n'
        "sku: h200-sxm-slice\ngpu_count: 1\nregion: us-east-1\nssh_keys: []\nstate: present\n"
        "requested_at: 2026-11-20T09:00:00Z\n"
    ).encode()


def _forged_pack(directory: Path, evil: bytes) -> None:
    """A cache as a PR would commit it: its own key, and `evil`'s bytes paired with a valid file's models."""
    good = _allocation("acme-research")
    parsed = loading.parse_files([(EVIL, good)])
    assert not parsed.errors
    typed = next(iter(parsed.state.allocations.values()))
    directory.mkdir(parents=True)
    key = secrets.token_bytes(cachestore.KEY_BYTES)
    (directory / cachestore.KEY_NAME).write_bytes(key)
    store = blobpacks.DiskStore(directory, key, blobpacks.reader_version(), lambda _: None)
    store.put_packs([blobpacks.encoded([(evil, (), ((0, 1, typed, ()),))])])
    store.close()


@pytest.fixture(params=[0o077, 0o022], ids=["umask077", "umask022"])
def mask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The CI runner's umask, which decides the modes git gives the committed cache."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_a_committed_cache_never_changes_the_plan(
    fleet_repo: Repo, tmp_path: Path, mask: int, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = fleet_repo.repo.head.commit.hexsha
    evil = _allocation("Evil Tenant <b>")
    _forged_pack(fleet_repo.root / ".gpuaas" / "cache", evil)
    fleet_repo.write(EVIL, evil.decode())
    fleet_repo.repo.git.add("-f", ".gpuaas", EVIL)
    fleet_repo.repo.index.commit("a PR with its own cache", author=PEOPLE, committer=PEOPLE)
    ci = tmp_path / "ci"
    subprocess.run(["git", "clone", "-q", str(fleet_repo.root), str(ci)], check=True, timeout=60)
    monkeypatch.chdir(ci)  # as CI runs it: from the checkout root, default cache settings
    flags = ("--offline", "--base", base, "--head", "HEAD")
    want = _run(capsys, *flags, "--no-cache")
    assert want[0] == 1  # the tenant breaks a field rule
    assert _run(capsys, *flags) == want
    assert _run(capsys, *flags, "--cache-dir", ".gpuaas/cache") == want  # named explicitly: refused too
    assert "not used: it lies inside" in _err(capsys, *flags, "--cache-dir", ".gpuaas/cache")
    assert _run(capsys, *flags) == want  # and the run after, from the real (outside) cache


def test_a_cache_inside_a_checkout_is_refused_with_where_it_goes(fleet_repo: Repo) -> None:
    notes: list[str] = []
    assert blobpacks.open_store(fleet_repo.root / "sub" / "cache", note=notes.append) is None
    assert "inside" in notes[0] and "--cache-dir" in notes[0] and "XDG_CACHE_HOME" in notes[0]
    plain = fleet_repo.root.parent / "outside"
    assert blobpacks.open_store(plain, note=notes.append, trees=[plain.parent]) is None  # the tree being read


def test_the_default_cache_is_outside_the_working_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.ENV_STATE_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cachestore.default_dir() == tmp_path / "xdg" / "gpuaas" / "cache"
    monkeypatch.setenv(settings.ENV_STATE_DIR, str(tmp_path / "state"))
    assert cachestore.default_dir() == tmp_path / "state" / "cache"


def test_a_result_is_never_replayed_for_another_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fleets in `a/` and `b/`; head breaks only `b/`: `plan b` after `plan a` still exits 1."""
    root = tmp_path / "two"
    make_fleet(root / "a")
    make_fleet(root / "b")
    repo = git.Repo.init(root, initial_branch="main")
    repo.git.add("-A")
    base = repo.index.commit("two fleets", author=PEOPLE, committer=PEOPLE).hexsha
    fleet = root / "b" / "fleet.yaml"
    fleet.write_text(fleet.read_text() + "unknown_field: 1\n")
    repo.git.add("-A")
    repo.index.commit("break b", author=PEOPLE, committer=PEOPLE)
    monkeypatch.chdir(tmp_path)
    flags = ("--offline", "--base", base, "--head", "HEAD")
    assert _run(capsys, str(root / "b"), *flags, "--no-cache")[0] == 1
    assert _run(capsys, str(root / "a"), *flags)[0] == 0
    assert _run(capsys, str(root / "b"), *flags)[0] == 1


def test_a_pack_entry_is_bound_to_its_bytes(tmp_path: Path) -> None:
    """An entry filed under another file's blob id (a pack our own key signed) is a miss, never that file."""
    store = blobpacks.open_store(tmp_path / "c", note=lambda _: None)
    assert store is not None
    data, other = b"kind: Fleet\n", b"kind: Sku\n"
    wrong = blobpacks.git_blob_id(other)
    payload = blobpacks._PICKLE + pickle.dumps((blobpacks.FORMAT, ((wrong, data, (), ()),)), protocol=5)
    store.put_packs([blobpacks.Encoded((wrong,), payload)])
    assert store.get_many([wrong]) == {}
    assert store.rejected == 1


def test_a_killed_writers_world_temp_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    store = blobpacks.open_store(tmp_path / "c", note=lambda _: None)
    assert store is not None
    key = "a" * 64
    old = 1_000_000_000.0
    gone = tmp_path / "c" / f"world-{'b' * 64}.999999999-1.tmp"  # no such pid
    legacy = tmp_path / "c" / f"world-{'c' * 64}.999999998.tmp"  # the old name: a pid only
    live = tmp_path / "c" / f"world-{'d' * 64}.{cachefiles.writer_tag(os.getpid())}.tmp"
    fresh = tmp_path / "c" / f"world-{'e' * 64}.999999997-1.tmp"  # dead, but young: left for now
    for path in (gone, legacy, live, fresh):
        path.write_bytes(b"x" * 10)
    for path in (gone, legacy, live):
        os.utime(path, (old, old))
    store.put_file("worlds", key, b"payload")
    assert not gone.exists() and not legacy.exists()
    assert live.exists() and fresh.exists()
    assert store.get_file("worlds", key) == b"payload"


@pytest.mark.parametrize(
    "name",
    [
        "desired.reading.safefiles\nPath",  # imported there, defined in pathlib
        "desired.reading.parsepool\nBaseProcess",  # imported there, defined in multiprocessing
        "reconciler.caches.blobs\nDiskStore",  # imported there, defined in reconciler.caches.blobpacks
        "reconciler.caches.blobs\nBlobCache",  # defined there, but no part of a world
        "reconciler.caches.blobpacks\nDiskStore",  # a module no world names
        "reconciler.placement.placing\nplan",  # a function
    ],
)
def test_the_world_unpickler_admits_only_listed_project_types(name: str) -> None:
    crafted = b"c" + name.encode() + b"\n."  # pickle's GLOBAL opcode: the class itself
    with pytest.raises(pickle.UnpicklingError):
        keptworlds._loads(crafted)
    assert keptworlds._loads(b"cdesired.state\nSource\n.") is Source
    assert keptworlds.load(crafted, None) is None  # a miss, never an error
