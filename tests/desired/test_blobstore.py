"""The on-disk blob cache (`reconciler.caches.blobpacks`): reused by CLI runs, never trusted.

Real git repositories (a copy of examples/fleet), a real SQLite file under a
temporary state dir. Every test compares what a run with the cache gives
with what a run without it gives.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import sqlite3
import stat
from pathlib import Path

import git
import pytest

from desired.reading import loading
from desired.state import LoadResult
from reconciler import cli, sources
from reconciler.caches import blobpacks, cachestore
from reconciler.caches.blobs import BlobCache

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
ACTOR = git.Actor("t", "t@example.com")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    r = git.Repo.init(root)
    r.git.add("-A")
    r.index.commit("base", author=ACTOR, committer=ACTOR)
    return root


def _picture(result: LoadResult) -> tuple[list[str], list[str]]:
    s = result.state
    models = [
        obj.model_dump_json()
        for table in (s.skus, s.images, s.nodes, s.slot_maps, s.allocations)
        for obj in table.values()
    ]
    return [p.render() for p in result.problems], models


def _load(root: Path, cache_dir: Path, notes: list[str] | None = None) -> tuple[LoadResult, blobpacks.DiskStore]:
    store = blobpacks.open_store(cache_dir, note=(notes.append if notes is not None else None))
    assert store is not None
    result = sources.load(root, "HEAD", cache=BlobCache(store))
    store.close()
    return result, store


def _rows(cache_dir: Path) -> list[tuple[str, str, bytes, bytes]]:
    """(version, blob, mac, payload of its pack) of every indexed blob."""
    with sqlite3.connect(cache_dir / cachestore.DB_NAME) as db:
        return db.execute(
            "SELECT e.version, e.blob, p.mac, p.payload FROM pack_entries e"
            " JOIN packs p ON p.id = e.pack ORDER BY e.blob"
        ).fetchall()


def _packs(cache_dir: Path) -> list[tuple[str, bytes, bytes]]:
    with sqlite3.connect(cache_dir / cachestore.DB_NAME) as db:
        return db.execute("SELECT version, mac, payload FROM packs ORDER BY id").fetchall()


def _rewrite(cache_dir: Path, **cols: object) -> None:
    """Change every pack (a small tree is one pack)."""
    with sqlite3.connect(cache_dir / cachestore.DB_NAME) as db:
        for col, value in cols.items():
            db.execute(f"UPDATE packs SET {col} = ?", (value,))  # noqa: S608 - test columns


def test_a_second_run_reads_every_blob_from_the_cache_and_gives_the_same_result(repo: Path, tmp_path: Path) -> None:
    cold = sources.load(repo, "HEAD")
    first, store = _load(repo, tmp_path / "cache")
    assert (store.hits, store.written) == (0, cold.state.file_count)
    second, store = _load(repo, tmp_path / "cache")
    assert (store.hits, store.rejected, store.written) == (cold.state.file_count, 0, 0)
    assert _picture(first) == _picture(second) == _picture(cold)


def test_cache_files_are_private(repo: Path, tmp_path: Path) -> None:
    _load(repo, tmp_path / "cache")
    for path, mode in (
        (tmp_path / "cache", 0o700),
        (tmp_path / "cache" / cachestore.DB_NAME, 0o600),
        (tmp_path / "cache" / cachestore.KEY_NAME, 0o600),
    ):
        assert stat.S_IMODE(os.lstat(path).st_mode) == mode, path


def test_a_damaged_pack_is_parsed_again_and_replaced(repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = sources.load(repo, "HEAD")
    _load(repo, cache)
    rows, packs = _rows(cache), _packs(cache)
    assert len(packs) == 1 and len(rows) == cold.state.file_count
    ((_version, _mac, payload),) = packs
    _rewrite(cache, payload=payload[:-3] + b"xyz")
    again, store = _load(repo, cache)
    assert (store.rejected, store.written) == (len(rows), len(rows))
    assert _picture(again) == _picture(cold)
    assert _rows(cache) == rows and _packs(cache) == packs  # rewritten as it was, the damaged pack gone


def test_an_entry_written_with_another_key_is_foreign_and_ignored(repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cold = sources.load(repo, "HEAD")
    _load(repo, cache)
    (cache / cachestore.KEY_NAME).write_bytes(os.urandom(cachestore.KEY_BYTES))  # another user's or machine's key
    again, store = _load(repo, cache)
    assert store.hits == 0
    assert store.rejected == store.written == cold.state.file_count
    assert _picture(again) == _picture(cold)


def test_a_payload_naming_a_class_is_refused_even_with_a_valid_mac(repo: Path, tmp_path: Path) -> None:
    """Defence in depth: the unpickler knows only the desired-state models and datetime.

    A crafted payload never runs code.
    """
    cache = tmp_path / "cache"
    _load(repo, cache)
    store = blobpacks.open_store(cache)
    assert store is not None
    rows = _rows(cache)
    # The pickle tag (every pack's encoding) and a class outside the allowed set.
    evil = b"p" + pickle.dumps((blobpacks.FORMAT, ((rows[0][1], io.BytesIO(b"x"), (), ()),)))
    _rewrite(cache, payload=evil, mac=store._mac(evil))
    again, store = _load(repo, cache)
    assert (store.rejected, store.written) == (len(rows), len(rows))
    assert _picture(again) == _picture(sources.load(repo, "HEAD"))


def test_bytes_that_are_not_the_blob_are_never_stored(repo: Path, tmp_path: Path) -> None:
    """An entry must hold the bytes its blob id names (positions come from them): the writer refuses others.

    A read does not hash the bytes again; the HMAC binds them to the blob id the writer checked.
    """
    cache = tmp_path / "cache"
    _load(repo, cache)
    rows = _rows(cache)
    a, b = rows[0][1], rows[1][1]
    store = blobpacks.open_store(cache)
    assert store is not None
    entries = store.get_many([a, b])
    store.put_many([(a, entries[b])])  # a's key, b's bytes
    store.close()
    assert store.written == 0
    assert _rows(cache) == rows
    again, store = _load(repo, cache)
    assert (store.hits, store.rejected) == (len(rows), 0)
    assert _picture(again) == _picture(sources.load(repo, "HEAD"))


def test_entries_of_another_reader_version_are_never_read_and_are_dropped(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(blobpacks, "reader_version", lambda: "an-older-reader")
    _load(repo, cache)
    monkeypatch.undo()
    again, store = _load(repo, cache)
    assert store.hits == 0
    assert store.written == again.state.file_count
    assert {r[0] for r in _rows(cache)} == {blobpacks.reader_version()}


def test_a_file_that_is_not_a_database_is_replaced(repo: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / cachestore.DB_NAME).write_bytes(b"not a database at all" * 100)
    os.chmod(cache / cachestore.DB_NAME, 0o600)
    notes: list[str] = []
    first, store = _load(repo, cache, notes)
    assert any("cannot be read" in n for n in notes)
    assert _picture(first) == _picture(sources.load(repo, "HEAD"))
    _, store = _load(repo, cache)
    assert store.hits == first.state.file_count


@pytest.mark.parametrize("damage", ["group_writable_dir", "readable_key", "symlinked_db"])
def test_an_unsafe_cache_is_not_used(repo: Path, tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "cache"
    _load(repo, cache)
    if damage == "group_writable_dir":
        os.chmod(cache, 0o770)  # noqa: S103 - the unsafe mode is what the test makes
    elif damage == "readable_key":
        os.chmod(cache / cachestore.KEY_NAME, 0o644)
    else:
        (cache / cachestore.DB_NAME).unlink()
        (cache / cachestore.DB_NAME).symlink_to(tmp_path / "elsewhere.sqlite3")
    notes: list[str] = []
    store = blobpacks.open_store(cache, note=notes.append)
    if store is not None:  # the symlink is found when the database is opened
        result = sources.load(repo, "HEAD", cache=BlobCache(store))
        assert store.hits == 0
        assert _picture(result) == _picture(sources.load(repo, "HEAD"))
        assert not (tmp_path / "elsewhere.sqlite3").exists()
    assert notes, "the run says why it parses without the cache"


def test_validate_and_plan_on_a_revision_use_the_cache_and_print_the_same(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    r = git.Repo(repo)
    (repo / "allocations" / "alloc-0001.yaml").unlink()
    r.git.add("-A")
    r.index.commit("drop one", author=ACTOR, committer=ACTOR)
    outputs = []
    for extra in (["--no-cache"], [], []):
        assert cli.main(["validate", str(repo), "--rev", "HEAD", "-o", "json", "--state-dir", str(state), *extra]) == 0
        assert (
            cli.main(
                [
                    "plan",
                    str(repo),
                    "--offline",
                    "--base",
                    "HEAD~1",
                    "--head",
                    "HEAD",
                    "-o",
                    "json",
                    "--state-dir",
                    str(state),
                    *extra,
                ]
            )
            == 0
        )
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert json.loads(outputs[0].split("\n}\n", 1)[0] + "\n}")["valid"] is True
    assert (state / "cache" / cachestore.DB_NAME).exists()
    # One entry per distinct blob of base and head, all written by the first cached run.
    assert len(_rows(state / "cache")) == len({ref.key for rev in ("HEAD", "HEAD~1") for ref in _refs(repo, rev)})


def _refs(root: Path, rev: str) -> list[loading.FileRef]:
    from desired.reading import gitrepo

    return gitrepo.revision_refs(root, rev)
