"""The blob store's fast paths (`desired.blobstore`): marshal payloads, a pickle fallback, a cheap commit.

Each test checks that a faster way of writing or reading keeps a safety
property of the module: exact values back, a foreign or odd payload a miss,
one transaction per write, old databases replaced rather than misread.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import marshal
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import git
import pytest

from desired import blobstore, loading
from reconciler import sources

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
ACTOR = git.Actor("t", "t@example.com")
WHEN = "kind: Note\nname: when\nat: 2024-05-01 10:00:00\nday: 2024-05-02\n"


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _store(directory: Path) -> blobstore.DiskStore:
    store = blobstore.open_store(directory)
    assert store is not None
    return store


def _payloads(directory: Path) -> dict[str, bytes]:
    with sqlite3.connect(directory / blobstore.DB_NAME) as db:
        return dict(db.execute("SELECT blob, payload FROM entries").fetchall())


def _entry(data: bytes, docs: tuple[tuple[int, int, Any], ...]) -> tuple[str, blobstore.Entry]:
    return _blob_id(data), blobstore.Entry(data, (("yaml.x", "a problem", 3, 4),), docs)


def test_plain_values_come_back_with_their_exact_types_from_a_marshal_payload(tmp_path: Path) -> None:
    value = {"a": [1, True, None, 2.5, "x", {"b": False}], "c": [[0], []], "big": 2**70}
    blob, entry = _entry(b"a: 1\n", ((0, 1, value), (1, 7, "scalar")))
    store = _store(tmp_path)
    store.put_many([(blob, entry)])
    got = _store(tmp_path).get_many([blob])[blob]
    assert got == entry
    assert [type(x) for x in got.docs[0][2]["a"]] == [int, bool, type(None), float, str, dict]
    assert _payloads(tmp_path)[blob][:1] == b"m"


def test_a_key_a_document_repeats_is_read_back_as_one_string(tmp_path: Path) -> None:
    """Written once per entry (marshal's back reference to an interned key): smaller, faster, less memory."""
    slots = [{"".join(["gp", "u"]): n} for n in range(3)]  # three equal keys, three objects, as a reader makes them
    assert len({id(k) for slot in slots for k in slot}) == 3
    blob, entry = _entry(b"slots: []\n", ((0, 1, {"slots": slots}),))
    _store(tmp_path).put_many([(blob, entry)])
    got = _store(tmp_path).get_many([blob])[blob]
    assert got == entry
    assert len({id(k) for slot in got.docs[0][2]["slots"] for k in slot}) == 1
    assert slots[0] == {"gpu": 0}  # the caller's values are not changed


def test_an_entry_holding_a_yaml_timestamp_is_pickled_and_read_back(tmp_path: Path) -> None:
    when = dt.datetime(2024, 5, 1, 10, tzinfo=dt.UTC)
    blob, entry = _entry(b"at: x\n", ((0, 1, {"at": when, "day": dt.date(2024, 5, 2)}),))
    _store(tmp_path).put_many([(blob, entry)])
    assert _payloads(tmp_path)[blob][:1] == b"p"
    assert _store(tmp_path).get_many([blob])[blob] == entry


def test_a_tree_with_timestamps_reads_the_same_from_the_cache(tmp_path: Path) -> None:
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    (root / "when.yaml").write_text(WHEN)
    r = git.Repo.init(root)
    r.git.add("-A")
    r.index.commit("base", author=ACTOR, committer=ACTOR)
    cold = sources.load(root, "HEAD")
    results = []
    for _ in range(2):
        store = _store(tmp_path / "cache")
        results.append(sources.load(root, "HEAD", cache=loading.BlobCache(store)))
        store.close()
    assert (store.hits, store.rejected) == (len(_payloads(tmp_path / "cache")), 0)
    assert _payloads(tmp_path / "cache")[_blob_id(WHEN.encode())][:1] == b"p"
    for result in results:
        assert [p.render() for p in result.problems] == [p.render() for p in cold.problems]


DATA = b"a: 1\n"
BLOB = _blob_id(DATA)


@pytest.mark.parametrize("payload", [
    b"m" + marshal.dumps((blobstore.FORMAT, BLOB, DATA, (), [])),  # docs a list, not a tuple
    b"m" + marshal.dumps((blobstore.FORMAT - 1, BLOB, DATA, (), ())),  # another format
    b"m" + marshal.dumps((blobstore.FORMAT, _blob_id(b"b: 2\n"), DATA, (), ())),  # another blob's
    b"m" + marshal.dumps((blobstore.FORMAT, BLOB, DATA, (("c", "m", 1, True),), ())),  # a bool column
    b"m" + marshal.dumps((blobstore.FORMAT, BLOB, DATA, (), ((0, 1, {"a": 1}, "extra"),))),
    b"m\xff not marshal",
    b"z" + marshal.dumps((blobstore.FORMAT, BLOB, DATA, (), ())),  # an encoding we never write
    b"",
])
def test_an_odd_payload_is_a_miss_even_with_a_valid_mac(tmp_path: Path, payload: bytes) -> None:
    """Defence in depth: a payload that passes the HMAC must still decode to what `put_many` writes."""
    store = _store(tmp_path)
    store.put_many([_entry(DATA, ())])
    assert store.get_many([BLOB]), "the entry as written is read back"
    with sqlite3.connect(tmp_path / blobstore.DB_NAME) as db:
        db.execute("UPDATE entries SET payload = ?, mac = ? WHERE blob = ?", (payload, store._mac(BLOB, payload), BLOB))
    store = _store(tmp_path)
    assert store.get_many([BLOB]) == {}
    assert store.rejected == 1


def test_a_format_1_database_is_dropped_on_the_next_write(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with sqlite3.connect(tmp_path / blobstore.DB_NAME) as db:
        db.execute("CREATE TABLE blobs (version TEXT NOT NULL, blob TEXT NOT NULL, mac BLOB NOT NULL,"
                   " payload BLOB NOT NULL, stamp INTEGER NOT NULL, PRIMARY KEY (version, blob)) WITHOUT ROWID")
        db.execute("INSERT INTO blobs VALUES ('old', 'b', x'00', x'00', 0)")
    blob, entry = _entry(b"a: 1\n", ((0, 1, {"a": 1}),))
    store.put_many([(blob, entry)])
    with sqlite3.connect(tmp_path / blobstore.DB_NAME) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"entries", "results"}
    assert _store(tmp_path).get_many([blob]) == {blob: entry}


def test_a_write_that_fails_half_way_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits are not synced to disk, but a write is still one transaction: all or nothing."""
    first = _entry(b"a: 1\n", ())
    _store(tmp_path).put_many([first])
    store = _store(tmp_path)

    def fail(db: sqlite3.Connection, keep: set[str]) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "_trim", fail)  # after the rows were inserted
    store.put_many([_entry(b"b: 2\n", ()), _entry(b"c: 3\n", ())])
    assert store.written == 0
    assert set(_payloads(tmp_path)) == {first[0]}


def test_commits_keep_the_rollback_journal_but_do_not_wait_for_the_disk(tmp_path: Path) -> None:
    db = _store(tmp_path)._connect()
    assert db.execute("PRAGMA synchronous").fetchone() == (0,)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
