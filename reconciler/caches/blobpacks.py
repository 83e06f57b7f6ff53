"""Parsed blobs on disk, for CLI runs (`plan`, `validate --rev`, PR plans in CI): packs in the cache store.

A git blob id names a file's bytes, so what the reader and typing made of
those bytes is kept in the cache store (`reconciler.caches.cachestore`) and
reused by the next run: each document's model (or the problems that refused
it), its line, the file's bytes for error positions, and the reader's own
problems.

Entries are written in packs, as git packs loose objects: the files one parse
worker read are one pickle (`packs`), and an index (`pack_entries`) names
the pack of each blob id. One pickle for a few hundred files shares its
strings and class references, and the worker sends its pack's bytes to the
parent instead of pickling the same models a second time for the pipe.
Every cross-file rule runs again on every load. Typing is a pure function of
the bytes and of the code that types (the models, pydantic): both are in the
version an entry is keyed by, so an entry gives exactly what typing the same
bytes again would.

A pack is never trusted: it is keyed by blob id and the reader version (a
hash of the reader's and the models' source, PyYAML's, pydantic's and
Python's version), carries an HMAC over version and payload under the
store's key, and is decoded only after the check, by an unpickler that knows
no class but the desired-state models and enums and `datetime`'s, into the
expected shape; a blob is taken from a pack only when the pack itself names
it, and only when its stored bytes hash to that blob id.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import io
import pickle
import sqlite3
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from desired.reading import modelfields
from desired.reading.packs import Codec, Encoded, Entry, Found, Packed, TypedDoc
from desired.reading.safefiles import blob_id as git_blob_id
from reconciler.caches import cachestore
from reconciler.caches.cachestore import Note, Store

__all__ = ["CODEC", "DiskStore", "Encoded", "Entry", "Found", "Packed", "TypedDoc", "git_blob_id", "open_store"]

FORMAT = 5  # 5: a model pickled as its fields (`_model`); 4 through pydantic's own __getstate__/__setstate__
MAX_ENTRIES = 200_000  # beyond this, the oldest entries not in the current tree are dropped
_CHUNK = 500  # keys per SELECT (SQLite's variable limit is 999 on old builds)
# The payload's first byte says how the rest is encoded (one way so far: pickle).
_PICKLE = b"p"

# The tables of the packs (created beside the store's own).
PACK_TABLES = (
    # A rowid table: entries are kilobytes, and a WITHOUT ROWID table keeps whole rows in
    # its b-tree (slower writes, a larger file).
    "CREATE TABLE IF NOT EXISTS packs (id INTEGER PRIMARY KEY, version TEXT NOT NULL,"
    " mac BLOB NOT NULL, payload BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS pack_entries (version TEXT NOT NULL, blob TEXT NOT NULL,"
    " pack INTEGER NOT NULL, stamp INTEGER NOT NULL, PRIMARY KEY (version, blob))",
)


def reader_version() -> str:
    """Changes whenever the reader could read the same bytes differently."""
    import pydantic
    import pydantic_core

    from desired import models, patterns, problems, state
    from desired.reading import blockstyle, documents, loading, parsepool, safefiles, yamlio

    h = hashlib.sha256(
        f"format {FORMAT}\0python {sys.version_info[:2]}\0pyyaml {yaml.__version__}\0"
        f"libyaml {getattr(yaml, '__with_libyaml__', False)}\0pydantic {pydantic.VERSION}\0"
        f"pydantic-core {pydantic_core.__version__}\0".encode()
    )
    sources = [Path(m.__file__ or "") for m in (yamlio, blockstyle, loading, documents, parsepool, safefiles)]
    sources += [Path(m.__file__ or "") for m in (patterns, problems, state)]
    sources += sorted(Path(models.__file__ or "").parent.glob("*.py"))  # the models are a package
    for source in sources:
        h.update(source.read_bytes())
    return h.hexdigest()[:32]


class _Unpickler(pickle.Unpickler):
    """Containers and scalars, the desired-state models and enums, and the datetime types.

    A model is rebuilt from its stored fields without validation (pickle's
    way): the entry's HMAC says this user's runs wrote it, from a model that
    was validated then, with the code the version names.
    """

    _DATETIME = frozenset({"datetime", "date", "timezone", "timedelta"})

    def find_class(self, module: str, name: str) -> Any:
        if module == "datetime" and name in self._DATETIME:
            return getattr(dt, name)
        if module.startswith("desired.models."):
            found = _model_classes().get(name)
            if found is not None and found.__module__ == module:
                return found
        if module == __name__ and name == "_model":
            return _model
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a cache entry")


@functools.cache
def _model_classes() -> dict[str, type]:
    """The classes an entry may name: `desired.models`' pydantic models and enums, nothing else."""
    import enum

    from pydantic import BaseModel

    from desired import models

    return {
        name: obj
        for name, obj in vars(models).items()
        if models.defined_here(obj) and (issubclass(obj, BaseModel) or issubclass(obj, enum.Enum))
    }


class DiskStore(Store):
    """The cache store of one state dir, with the packs of parsed blobs. Open with `open_store`."""

    SCHEMA = Store.SCHEMA + PACK_TABLES

    def __init__(self, directory: Path, secret: bytes, version: str, note: Note) -> None:
        super().__init__(directory, secret, version, note)
        self.codec = CODEC

    def _mac(self, payload: bytes) -> bytes:
        # hmac.digest: the one-shot C path. "pack": its own domain, never a result's MAC.
        return hmac.digest(self._secret, f"{self.version}\0pack\0".encode() + payload, "sha256")

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """The trusted entries among `keys` (a damaged or foreign entry is counted in `rejected`, never returned)."""
        if self.broken or not keys:
            return {}
        found: dict[str, Entry] = {}
        try:
            db = self._connect()
            wanted: dict[int, list[str]] = {}  # pack id -> the keys the index says it holds
            unique = sorted(set(keys))
            for i in range(0, len(unique), _CHUNK):
                chunk = unique[i : i + _CHUNK]
                for blob, pack in db.execute(
                    f"SELECT blob, pack FROM pack_entries WHERE version = ? AND blob IN "  # noqa: S608 - only placeholders are formatted in
                    f"({','.join('?' * len(chunk))})",
                    (self.version, *chunk),
                ):
                    wanted.setdefault(pack, []).append(blob)
            ids = sorted(wanted)
            for i in range(0, len(ids), _CHUNK):
                chunk_ids = ids[i : i + _CHUNK]
                rows = db.execute(
                    f"SELECT id, mac, payload FROM packs WHERE version = ? AND id IN "  # noqa: S608 - only placeholders are formatted in
                    f"({','.join('?' * len(chunk_ids))})",
                    (self.version, *chunk_ids),
                ).fetchall()
                for pack, mac, payload in rows:
                    entries = self._check(mac, payload)
                    for blob in wanted.pop(pack):
                        entry = entries.get(blob) if entries is not None else None
                        # Bound to its bytes: an entry is taken only under the git blob id of the bytes
                        # stored with it (hashed here, for the blobs asked for only), so no pack can pair
                        # one file's bytes, or its models, with another file's id.
                        if entry is None or git_blob_id(entry.data) != blob:
                            self.rejected += 1
                        else:
                            found[blob] = entry
        except sqlite3.Error as e:
            self._broken("cannot be read", e)
            return {}
        self.hits += len(found)
        return found

    def _check(self, mac: Any, payload: Any) -> dict[str, Entry] | None:
        if not (isinstance(mac, bytes) and isinstance(payload, bytes)):
            return None
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None  # written with another key (foreign) or damaged
        try:
            value = _decode(payload)
        except Exception:  # whatever a damaged payload raises, the pack is a miss
            return None
        return _pack_entries(value)

    # ------------------------------------------------------------- results

    def put_many(self, entries: Iterable[tuple[str, Entry]], *, keep: Iterable[str] = ()) -> None:
        """Store entries as one pack (`put_packs`); an entry whose bytes are not the blob it names is not stored."""
        self.put_packs(
            [
                encoded(
                    [
                        (entry.data, entry.problems, entry.docs)
                        for blob, entry in entries
                        if git_blob_id(entry.data) == blob
                    ]
                )
            ],
            keep=keep,
        )

    def put_packs(self, packs: Iterable[Encoded], *, keep: Iterable[str] = ()) -> None:
        """Store packs in one transaction; drop other versions' entries, and old ones past MAX_ENTRIES.

        A pack names each of its blobs by the git blob id of the bytes it
        holds (`encoded`), so the index only ever points a blob id at its
        own bytes. A blob in a newer pack is read from that one; a pack no
        blob points at any more is deleted.
        """
        rows = [(self.version, self._mac(p.payload), p.payload, p.blobs) for p in packs if p.blobs]
        if not rows:
            return
        now = int(time.time())

        def write(db: sqlite3.Connection) -> None:
            db.execute("DROP TABLE IF EXISTS blobs")  # format 1's table: its entries are never read again
            db.execute("DROP TABLE IF EXISTS entries")  # format 3's (one row per blob)
            for version, mac, payload, blobs in rows:
                pack = db.execute(
                    "INSERT INTO packs (version, mac, payload) VALUES (?, ?, ?)", (version, mac, payload)
                ).lastrowid
                db.executemany(
                    "INSERT OR REPLACE INTO pack_entries VALUES (?, ?, ?, ?)",
                    [(version, blob, pack, now) for blob in blobs],
                )
            db.execute("DELETE FROM pack_entries WHERE version <> ?", (self.version,))
            self._trim(db, set(keep) | {blob for row in rows for blob in row[3]})
            db.execute(
                "DELETE FROM packs WHERE version <> ? OR id NOT IN (SELECT pack FROM pack_entries)", (self.version,)
            )

        if self._transaction(write, busy="not updated", attempts=2):
            self.written += sum(len(row[3]) for row in rows)

    def _trim(self, db: sqlite3.Connection, keep: set[str]) -> None:
        (count,) = db.execute("SELECT count(*) FROM pack_entries").fetchone()
        excess = int(count) - MAX_ENTRIES
        if excess <= 0:
            return
        old = [b for (b,) in db.execute("SELECT blob FROM pack_entries ORDER BY stamp").fetchall() if b not in keep]
        db.executemany(
            "DELETE FROM pack_entries WHERE version = ? AND blob = ?", [(self.version, b) for b in old[:excess]]
        )


def encoded(files: Sequence[Packed]) -> Encoded:
    """The pack of these files (pure: a parse worker makes it beside the parse).

    Models need pickle; the tag byte leaves room for another encoding. A
    model goes as its class and validated fields (`_model`), not through
    pydantic's own pickling: a state dict per model made and read back by
    Python code on both sides of the pipe and the disk.
    """
    items = tuple((git_blob_id(data), data, problems, docs) for data, problems, docs in files)
    out = io.BytesIO()
    out.write(_PICKLE)
    pickler = pickle.Pickler(out, protocol=5)
    pickler.dispatch_table = _reducers()  # asked only about objects of these exact types
    pickler.dump((FORMAT, items))
    return Encoded(tuple(item[0] for item in items), out.getvalue())


def _model(cls: Any, values: Any, fields_set: Any) -> Any:
    """A model made again from its validated fields (`modelfields.rebuild`); a refusal makes the pack a miss."""
    try:
        return modelfields.rebuild(cls, values, fields_set)
    except TypeError as e:
        raise pickle.UnpicklingError(str(e)) from e


@functools.cache
def _reducers() -> dict[type, Any]:
    def reduce(obj: Any) -> tuple[Any, ...]:
        return _model, modelfields.fields(obj)

    return dict.fromkeys(modelfields.model_classes(), reduce)


def decode_pack(payload: bytes) -> dict[str, Entry] | None:
    """The entries of a pack this process's own parse worker made, None if it is not one `encoded` made.

    Never for a pack from disk (`get_many` checks those). Read as the pool's
    results are, by plain pickle: the bytes come straight from our worker
    over the pool's pipe, as every result of that pool does.
    """
    if payload[:1] != _PICKLE:
        return None
    value = pickle.loads(memoryview(payload)[1:])  # noqa: S301 - our own worker's bytes (see above)
    if not (isinstance(value, tuple) and len(value) == 2 and value[0] == FORMAT):
        return None
    return {blob: Entry(data, problems, docs) for blob, data, problems, docs in value[1]}


def _decode(payload: bytes) -> Any:
    """The value of a payload `encoded` made, read from disk; only called once its HMAC verified."""
    tag, body = payload[:1], memoryview(payload)[1:]
    if tag == _PICKLE:
        return _Unpickler(io.BytesIO(body)).load()
    raise ValueError(f"unknown payload encoding {tag!r}")


def _pack_entries(value: Any) -> dict[str, Entry] | None:
    """The entries a pack holds by blob id, or None when its shape is not what `encoded` writes."""
    if not (isinstance(value, tuple) and len(value) == 2 and value[0] == FORMAT and isinstance(value[1], tuple)):
        return None
    out: dict[str, Entry] = {}
    for item in value[1]:
        if not (isinstance(item, tuple) and len(item) == 4 and isinstance(item[0], str)):
            return None
        entry = _entry(*item[1:])
        if entry is None:
            return None
        out[item[0]] = entry
    return out


def _entry(data: Any, problems: Any, docs: Any) -> Entry | None:
    """One file of a pack, or None when its shape is not what `encoded` writes."""
    if not (isinstance(data, bytes) and isinstance(problems, tuple) and isinstance(docs, tuple)):
        return None
    if not all(_found(item) for item in problems):
        return None
    documents = _document_classes()
    for item in docs:
        if not (
            isinstance(item, tuple)
            and len(item) == 4
            and type(item[0]) is int
            and type(item[1]) is int
            and (item[2] is None or type(item[2]) in documents)
            and isinstance(item[3], tuple)
            and all(_found(x) for x in item[3])
        ):
            return None
    # The models are bound to these bytes by the HMAC over the whole pack, under a key only this
    # product made, outside every checkout (`open_store`): nothing a tree holds can sign a pack.
    return Entry(data, problems, docs)


def _found(item: Any) -> bool:
    return (
        isinstance(item, tuple)
        and len(item) == 4
        and isinstance(item[0], str)
        and isinstance(item[1], str)
        and type(item[2]) is int
        and type(item[3]) is int
    )


@functools.cache
def _document_classes() -> frozenset[type]:
    from desired import models

    return frozenset(models.KINDS.values())


def _decode_own(payload: bytes) -> dict[str, Entry] | None:
    return decode_pack(payload)


# How a parse worker encodes its pack and this process reads it back (`desired.reading.packs.Codec`).
CODEC = Codec(encoded, _decode_own)


def open_store(
    directory: Path | None = None, *, note: Note | None = None, trees: Iterable[Path] = ()
) -> DiskStore | None:
    """The cache store under `directory` (default `cachestore.default_dir()`), with its packs; None when unsafe.

    See `cachestore.open_store`: refused inside any git checkout or any of `trees`.
    """
    return cachestore.open_store(directory, note=note, trees=trees, make=DiskStore, version=reader_version)
