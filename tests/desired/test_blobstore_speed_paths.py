"""The blob store's fast paths (`reconciler.caches.blobpacks`): typed entries in packs, a cheap commit.

Each test checks that a faster way of writing or reading keeps a safety
property of the module: exact models back, a foreign or odd payload a miss,
one transaction per write, old databases replaced rather than misread.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import pickle
import shutil
import sqlite3
from pathlib import Path

import git
import pytest

from desired import models as m
from desired.reading import parsepool
from reconciler import sources
from reconciler.caches import blobpacks, cachestore
from reconciler.caches.blobs import BlobCache

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
ACTOR = git.Actor("t", "t@example.com")
WHEN = "kind: Note\nname: when\nat: 2024-05-01 10:00:00\nday: 2024-05-02\n"


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _store(directory: Path) -> blobpacks.DiskStore:
    store = blobpacks.open_store(directory)
    assert store is not None
    return store


def _payloads(directory: Path) -> dict[str, bytes]:
    """Each indexed blob id and the payload of the pack the index names for it."""
    with sqlite3.connect(directory / cachestore.DB_NAME) as db:
        return dict(db.execute("SELECT e.blob, p.payload FROM pack_entries e JOIN packs p ON p.id = e.pack").fetchall())


def _entry(data: bytes, docs: tuple[blobpacks.TypedDoc, ...]) -> tuple[str, blobpacks.Entry]:
    return _blob_id(data), blobpacks.Entry(data, (("yaml.x", "a problem", 3, 4),), docs)


def _typed(name: str, data: bytes) -> tuple[str, blobpacks.Entry]:
    """The entry the parse worker makes for `data` (parsepool._parse_chunk with the store's pack)."""
    pack, _parts = parsepool._parse_chunk([(name, data)], False, False, blobpacks.CODEC.encode)
    assert pack is not None
    (blob,) = pack.blobs
    entries = blobpacks.decode_pack(pack.payload)
    assert entries is not None
    return blob, entries[blob]


def test_typed_documents_come_back_as_equal_models_of_the_same_classes(tmp_path: Path) -> None:
    data = (EXAMPLE / "nodes").glob("*.yaml").__next__().read_bytes()
    blob, entry = _typed("nodes/x.yaml", data)
    model = entry.docs[0][2]
    assert isinstance(model, m.Node)
    _store(tmp_path).put_many([(blob, entry)])
    got = _store(tmp_path).get_many([blob])[blob]
    assert got == entry
    back = got.docs[0][2]
    assert type(back) is m.Node and back == model and back is not model
    assert back.model_fields_set == model.model_fields_set
    assert {type(v) for v in back.__dict__.values()} == {type(v) for v in model.__dict__.values()}


def test_a_model_holding_a_timestamp_comes_back_with_its_timezone(tmp_path: Path) -> None:
    blob, entry = _typed("allocations/a.yaml", (EXAMPLE / "allocations" / "alloc-0001.yaml").read_bytes())
    model = entry.docs[0][2]
    assert isinstance(model, m.Allocation) and model.requested_at.tzinfo is not None
    _store(tmp_path).put_many([(blob, entry)])
    back = _store(tmp_path).get_many([blob])[blob].docs[0][2]
    assert back == model and back.requested_at.utcoffset() == model.requested_at.utcoffset()


def test_a_document_typing_refused_keeps_its_problems_and_no_model(tmp_path: Path) -> None:
    data = b"apiVersion: gpuaas.io/v1alpha1\nkind: Node\nname: n1\nbogus: 1\n"
    blob, entry = _typed("nodes/n1.yaml", data)
    ((_index, _line, model, found),) = entry.docs
    assert model is None and "desired.field.unknown" in [code for code, *_ in found]
    _store(tmp_path).put_many([(blob, entry)])
    assert _store(tmp_path).get_many([blob])[blob] == entry


def test_a_pack_names_a_file_only_by_the_blob_id_of_its_bytes(tmp_path: Path) -> None:
    pack, _parts = parsepool._parse_chunk([("a.yaml", DATA)], False, False, blobpacks.CODEC.encode)
    assert pack is not None and pack.blobs == (BLOB,)
    store = _store(tmp_path)
    store.put_packs([pack])
    assert store.written == 1 and _payloads(tmp_path) == {BLOB: pack.payload}
    # An index row pointing another blob id at this pack is a miss: the pack does not name it.
    other = _blob_id(b"other\n")
    store.put_packs([blobpacks.Encoded((other,), pack.payload)])
    assert store.get_many([other]) == {} and store.rejected == 1
    assert set(store.get_many([BLOB])) == {BLOB}


def test_a_blob_written_again_is_read_from_its_newest_pack_and_old_packs_go(tmp_path: Path) -> None:
    store = _store(tmp_path)
    a, b = _entry(b"a: 1\n", ()), _entry(b"b: 2\n", ())
    store.put_many([a, b])
    store.put_many([a])
    store.put_many([b])  # the first pack now holds nothing the index points at
    with sqlite3.connect(tmp_path / cachestore.DB_NAME) as db:
        assert db.execute("SELECT count(*) FROM packs").fetchone() == (2,)
    assert _store(tmp_path).get_many([a[0], b[0]]) == {a[0]: a[1], b[0]: b[1]}


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
        results.append(sources.load(root, "HEAD", cache=BlobCache(store)))
        store.close()
    assert (store.hits, store.rejected) == (len(_payloads(tmp_path / "cache")), 0)
    for result in results:
        assert [p.render() for p in result.problems] == [p.render() for p in cold.problems]


DATA = b"a: 1\n"
BLOB = _blob_id(DATA)


def _p(value: object) -> bytes:
    return b"p" + pickle.dumps(value, protocol=5)


def _pack(*items: object) -> bytes:
    return _p((blobpacks.FORMAT, items))


class _Model:
    """Pickles as a call of the packs' model rebuilder with these arguments (what a forged pack could hold)."""

    def __init__(self, *args: object) -> None:
        self.args = args

    def __reduce__(self) -> tuple[object, ...]:
        return blobpacks._model, self.args


@pytest.mark.parametrize(
    "payload",
    [
        _pack((BLOB, DATA, (), [])),  # docs a list, not a tuple
        _p((blobpacks.FORMAT - 1, ((BLOB, DATA, (), ()),))),  # another format
        _p((blobpacks.FORMAT, [(BLOB, DATA, (), ())])),  # files a list, not a tuple
        _pack((_blob_id(b"b: 2\n"), DATA, (), ())),  # names another blob only
        _pack((BLOB, DATA, (("c", "m", 1, True),), ())),  # a bool column
        _pack((BLOB, DATA, (), ((0, 1, None, (), "extra"),))),
        _pack((BLOB, DATA, (), ((0, 1, {"a": 1}, ()),))),  # a plain value where a model goes
        # A model of desired.models that is not a document kind:
        _pack((BLOB, DATA, (), ((0, 1, m.Region(name="r", pools=(m.Pool(name="p"),)), ()),))),
        _pack((BLOB, DATA, (), ((0, 1, None, (("c", "m", 1),)),))),  # a short problem
        _pack((BLOB, DATA, (), ((0, 1, _Model(dt.datetime, {}, set()), ()),))),  # the rebuilder on a non-model
        _pack((BLOB, DATA, (), ((0, 1, _Model(m.Node, {}, ["name"]), ()),))),  # fields set not a set
        _pack(
            (BLOB, DATA, ()),
        ),  # a file without its documents
        _pack((BLOB, DATA, (), ()), "not a file"),  # one good file, one odd: the whole pack is a miss
        b"p\xff not pickle",
        b"z" + pickle.dumps((blobpacks.FORMAT, ((BLOB, DATA, (), ()),))),  # an encoding we never write
        b"",
    ],
)
def test_an_odd_payload_is_a_miss_even_with_a_valid_mac(tmp_path: Path, payload: bytes) -> None:
    """Defence in depth: a payload that passes the HMAC must still decode to what `encoded` writes."""
    store = _store(tmp_path)
    store.put_many([_entry(DATA, ())])
    assert store.get_many([BLOB]), "the entry as written is read back"
    with sqlite3.connect(tmp_path / cachestore.DB_NAME) as db:
        db.execute("UPDATE packs SET payload = ?, mac = ?", (payload, store._mac(payload)))
    store = _store(tmp_path)
    assert store.get_many([BLOB]) == {}
    assert store.rejected == 1


def test_format_1_and_3_tables_are_dropped_on_the_next_write(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with sqlite3.connect(tmp_path / cachestore.DB_NAME) as db:
        db.execute(
            "CREATE TABLE blobs (version TEXT NOT NULL, blob TEXT NOT NULL, mac BLOB NOT NULL,"
            " payload BLOB NOT NULL, stamp INTEGER NOT NULL, PRIMARY KEY (version, blob)) WITHOUT ROWID"
        )
        db.execute("INSERT INTO blobs VALUES ('old', 'b', x'00', x'00', 0)")
        db.execute(
            "CREATE TABLE entries (version TEXT NOT NULL, blob TEXT NOT NULL, mac BLOB NOT NULL,"
            " payload BLOB NOT NULL, stamp INTEGER NOT NULL, PRIMARY KEY (version, blob))"
        )
    blob, entry = _entry(b"a: 1\n", ((0, 1, None, ()),))
    store.put_many([(blob, entry)])
    with sqlite3.connect(tmp_path / cachestore.DB_NAME) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    # the pack tables and one table per namespace; the format 1 and 3 tables are gone
    assert tables == {"packs", "pack_entries", *cachestore.RECORDS, *cachestore.FILES}
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
