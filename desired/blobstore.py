"""Parsed blobs on disk, for CLI runs (`plan`, `validate --rev`, PR plans in CI).

A git blob id names a file's bytes, so what the reader and typing made of
those bytes can be kept in a cache dir outside every repository
(`$GPUAAS_STATE_DIR/cache`, else `${XDG_CACHE_HOME:-~/.cache}/gpuaas/cache`)
and reused by the next run: each document's model (or the problems that refused it), its
line, the file's bytes for error positions, and the reader's own problems.

Entries are written in packs, as git packs loose objects: the files one parse
worker read are one pickle (`packs`), and an index (`pack_entries`) names
the pack of each blob id. One pickle for a few hundred files shares its
strings and class references, where one per file repeated them: at 10,000
nodes, writing took 0.48 s of CPU instead of 0.66, reading 0.47 instead of
0.75, and the worker sends its pack's bytes to the parent instead of
pickling the same models a second time for the pipe.
Every cross-file rule runs again on every load. Typing is a pure function of
the bytes and of the code that types (the models, pydantic): both are in the
version an entry is keyed by, so an entry gives exactly what typing the same
bytes again would.

The cache is an optimization and is never trusted:

- entries are keyed by blob id and the reader version (a hash of the
  reader's and the models' source, PyYAML's, pydantic's and Python's
  version): another version's entries are never read, and are dropped on
  the next write;
- the cache, and so its key, is never inside a git checkout or the tree a
  command reads (`open_store` refuses it and says where it goes instead):
  the trust in a pack must never come from the files being planned;
- every pack carries an HMAC-SHA256 over version and payload, with a random
  key this product makes on first use (`key`, mode 0600): a pack this user's runs did not
  write (foreign), or a damaged one, fails the check and its files are
  parsed again; the payload is decoded only after the check, by an
  unpickler that knows no class but the desired-state models and enums
  (`desired.models`) and `datetime`'s, and must have the expected shape; a
  blob is taken from a pack only when the pack itself names it (the index
  is a hint), and a pack's blob id is checked on read to be the git blob id
  of the bytes stored with it, so an entry's bytes are its blob's (error
  positions point at the right text) and its models are the ones the HMAC
  bound to those bytes;
- the directory must be ours and writable by nobody else, the files ours
  with mode 0600 and no symlinks; otherwise the cache is off for the run
  and `note` says why;
- writes are SQLite transactions (atomic: a run killed mid-write leaves the
  previous content); a database that cannot be read is replaced. They are
  not synced to disk (`synchronous=OFF`): only an OS crash or a power loss
  can damage the file, and damage is a failed HMAC or a replaced database.

The same database keeps a few whole command results (`results`: a finished
offline PR plan, `reconciler.commands.plancache`) under a key the caller
hashes from every input; they carry their own HMAC and are bytes the caller
parses as plain data.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import functools
import hashlib
import hmac
import io
import os
import pickle
import secrets
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

FORMAT = 4  # 4: packs of typed documents (models), pickled, a tag byte first; 3 kept one row per blob
KEY_BYTES = 32
DB_NAME = "blobs.sqlite3"
KEY_NAME = "key"
ENV_STATE_DIR = "GPUAAS_STATE_DIR"
MAX_ENTRIES = 200_000  # beyond this, the oldest entries not in the current tree are dropped
MAX_RESULTS = 64  # whole command results (PR plans) kept; the newest win
TEMP_GRACE_S = 600  # a kept base's temp file older than this, whose writer is dead, is removed
MAX_WORLDS = 2  # kept bases of PR plans (tens of MB each, `reconciler.commands.baseworld`); the newest win
_CHUNK = 500  # keys per SELECT (SQLite's variable limit is 999 on old builds)
# The payload's first byte says how the rest is encoded (one way so far: pickle).
_PICKLE = b"p"

Note = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Entry:
    """What the reader and typing made of one blob: its bytes, the reader's problems, its documents."""

    data: bytes
    problems: tuple[Found, ...]  # the reader's (a file-level refusal)
    docs: tuple[TypedDoc, ...]


# A problem without its file (the caller's): code, message, line, column.
Found = tuple[str, str, int, int]
# One document: index in its file, line, its model (None: typing refused it), typing's problems.
TypedDoc = tuple[int, int, Any, tuple[Found, ...]]


def default_dir() -> Path:
    """`$GPUAAS_STATE_DIR/cache`, else the user's cache dir: `${XDG_CACHE_HOME:-~/.cache}/gpuaas/cache`.

    Never the database's default state dir (`.gpuaas`, relative to where the
    command runs): CI runs from the checkout root, so a cache there would be
    one the pull request being planned can commit, key and all.
    """
    env = os.environ.get(ENV_STATE_DIR)
    if env:
        return Path(env) / "cache"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "gpuaas" / "cache"


def checkout_holding(directory: Path, trees: Iterable[Path] = ()) -> Path | None:
    """The git checkout (a folder holding `.git`) or planned tree that `directory` lies in, if any.

    A cache or key found there could be the tree's own bytes (a pull request
    can commit a `.gpuaas/cache` with its own key), so it is never used.
    """
    here = Path(os.path.abspath(directory)).resolve()
    for tree in trees:
        top = Path(os.path.abspath(tree)).resolve()
        if here == top or top in here.parents:
            return top
    for folder in (here, *here.parents):
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def reader_version() -> str:
    """Changes whenever the reader could read the same bytes differently."""
    import pydantic
    import pydantic_core

    from desired import models, patterns, problems
    from desired.reading import blockstyle, loading, yamlio

    h = hashlib.sha256(
        f"format {FORMAT}\0python {sys.version_info[:2]}\0pyyaml {yaml.__version__}\0"
        f"libyaml {getattr(yaml, '__with_libyaml__', False)}\0pydantic {pydantic.VERSION}\0"
        f"pydantic-core {pydantic_core.__version__}\0".encode()
    )
    for module in (yamlio, blockstyle, loading, models, patterns, problems):
        h.update(Path(module.__file__ or "").read_bytes())
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
        if module == "desired.models":
            found = _model_classes().get(name)
            if found is not None:
                return found
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
        if isinstance(obj, type)
        and obj.__module__ == models.__name__
        and (issubclass(obj, BaseModel) or issubclass(obj, enum.Enum))
    }


class DiskStore:
    """The on-disk cache of one state dir. Open with `open_store`; every failure degrades to a miss."""

    def __init__(self, directory: Path, secret: bytes, version: str, note: Note) -> None:
        self.directory, self.version, self.note = directory, version, note
        self._secret = secret
        self.path = directory / DB_NAME
        self.hits = self.rejected = self.written = 0
        self._db: sqlite3.Connection | None = None
        self.broken = False

    # ------------------------------------------------------------- plumbing

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            _private_file(self.path)
            db = sqlite3.connect(self.path, timeout=5.0, isolation_level=None)
            # A lost cache costs one cold run: a commit need not wait for the disk. The rollback
            # journal stays, so a run killed mid-write still leaves the previous content.
            db.execute("PRAGMA synchronous = OFF")
            # A rowid table: entries are kilobytes, and a WITHOUT ROWID table keeps whole rows in
            # its b-tree (writes took twice as long, the file was a third larger).
            db.execute(
                "CREATE TABLE IF NOT EXISTS packs (id INTEGER PRIMARY KEY, version TEXT NOT NULL,"
                " mac BLOB NOT NULL, payload BLOB NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS pack_entries (version TEXT NOT NULL, blob TEXT NOT NULL,"
                " pack INTEGER NOT NULL, stamp INTEGER NOT NULL, PRIMARY KEY (version, blob))"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, mac BLOB NOT NULL,"
                " payload BLOB NOT NULL, stamp INTEGER NOT NULL) WITHOUT ROWID"
            )
            # A kept base's payload is a file beside the database (`world-<key>`): tens of MB read
            # from a chain of SQLite overflow pages took 0.3 s, one read() of a file 0.02 s.
            db.execute(
                "CREATE TABLE IF NOT EXISTS worlds (key TEXT PRIMARY KEY, mac BLOB NOT NULL,"
                " size INTEGER NOT NULL, stamp INTEGER NOT NULL) WITHOUT ROWID"
            )
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _mac(self, payload: bytes) -> bytes:
        # hmac.digest: the one-shot C path. "pack": its own domain, never a result's MAC.
        return hmac.digest(self._secret, f"{self.version}\0pack\0".encode() + payload, "sha256")

    def _broken(self, what: str, e: Exception) -> None:
        self.note(f"blob cache {self.path}: {what}: {e}; parsing without it")
        self.broken = True
        self.close()

    # ------------------------------------------------------------- reading

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

    def get_result(self, key: str) -> bytes | None:
        """A whole command result stored under `key` (the caller's hash of every input), if trusted.

        The payload is returned as bytes only after its HMAC verifies; the
        caller parses it as plain data (JSON), never as code.
        """
        row = self._select("SELECT mac, payload FROM results WHERE key = ?", key)
        return self._trusted("results", key, *row) if row is not None else None

    def put_result(self, key: str, payload: bytes) -> None:
        """Store one result; keep only the newest MAX_RESULTS (a miss only costs a full run)."""
        row = (key, self._result_mac(key, payload, "results"), payload, time.time_ns())

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?)", row)
            db.execute(
                "DELETE FROM results WHERE key NOT IN (SELECT key FROM results ORDER BY stamp DESC LIMIT ?)",
                (MAX_RESULTS,),
            )

        self._transaction(write, busy="result not stored")

    def get_world(self, key: str) -> bytes | None:
        """A kept PR-plan base stored under `key` (`reconciler.commands.baseworld`), once its HMAC verifies.

        Unlike a result, the caller unpickles it (with its own allow-list):
        only the HMAC, under this store's secret key, says this user's runs
        wrote it. The file must be ours, regular, private and of the recorded size.
        """
        row = self._select("SELECT mac, size FROM worlds WHERE key = ?", key)
        if row is None:
            return None
        mac, size = row
        return self._trusted("worlds", key, mac, _read_private(self._world_path(key), size))

    def put_world(self, key: str, payload: bytes) -> None:
        """Store one kept base; keep only the newest MAX_WORLDS (each is tens of MB)."""
        path = self._world_path(key)
        self._sweep_temps()
        temp = path.with_name(f"{path.name}.{_writer_tag(os.getpid())}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(temp, path)  # atomic: a reader sees the old file, the new one, or none
        except OSError as e:
            self.note(f"blob cache {self.directory}: kept base not stored: {e.strerror or e}")
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return
        row = (key, self._result_mac(key, payload, "worlds"), len(payload), time.time_ns())
        kept: set[str] = set()

        def write(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO worlds VALUES (?, ?, ?, ?)", row)
            db.execute(
                "DELETE FROM worlds WHERE key NOT IN (SELECT key FROM worlds ORDER BY stamp DESC LIMIT ?)",
                (MAX_WORLDS,),
            )
            kept.update(k for (k,) in db.execute("SELECT key FROM worlds"))

        if self._transaction(write, busy="kept base not stored"):
            # Files no row names: older worlds, and any a run killed between its file and its row left.
            # (A `.tmp` file may be another run's write in progress: left alone.)
            for stale in self.directory.glob("world-*"):
                if not stale.name.endswith(".tmp") and stale.name.removeprefix("world-") not in kept:
                    with contextlib.suppress(OSError):
                        stale.unlink()

    def _sweep_temps(self) -> None:
        """Remove the `world-*.tmp` of writers that died mid-write (killed: tens of MB each, left for good).

        Only a file both older than TEMP_GRACE_S and whose writer (the pid and
        start time in its name) no longer runs: never another live run's
        write, even one in another pid namespace sharing this directory.
        """
        now = time.time()
        for temp in self.directory.glob("world-*.tmp"):
            owner = temp.name.removesuffix(".tmp").rpartition(".")[2]
            try:
                st = os.lstat(temp)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime > TEMP_GRACE_S and not _writer_alive(owner):
                    temp.unlink()
                    self.note(f"blob cache {self.directory}: removed {temp.name}, left by a writer that died")
            except OSError:
                continue

    def _world_path(self, key: str) -> Path:
        if not all(c in "0123456789abcdef" for c in key) or len(key) != 64:
            raise ValueError("a world key is a sha256 hex digest")  # never a path from elsewhere
        return self.directory / f"world-{key}"

    def _select(self, sql: str, key: str) -> tuple[Any, ...] | None:
        """The row of `key`, or None: none, or a database that cannot be read (the run goes on without it)."""
        if self.broken:
            return None
        try:
            row: tuple[Any, ...] | None = self._connect().execute(sql, (key,)).fetchone()
        except sqlite3.Error as e:
            self._broken("cannot be read", e)
            return None
        return row

    def _trusted(self, table: str, key: str, mac: Any, payload: Any) -> bytes | None:
        """`payload`, when it is bytes whose HMAC is `mac`; else None, counted in `rejected`."""
        if (
            isinstance(mac, bytes)
            and isinstance(payload, bytes)
            and hmac.compare_digest(mac, self._result_mac(key, payload, table))
        ):
            return payload
        self.rejected += 1
        return None

    def _result_mac(self, key: str, payload: bytes, table: str) -> bytes:
        # Its own domain ("result", "world"): a blob entry's MAC can never pass for a result's,
        # nor a result (plain JSON) for a kept base (unpickled).
        return hmac.digest(self._secret, f"{table[:-1]}\0{key}\0".encode() + payload, "sha256")

    # ------------------------------------------------------------- writing

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

    def _transaction(self, write: Callable[[sqlite3.Connection], None], *, busy: str, attempts: int = 1) -> bool:
        """Run `write` in one IMMEDIATE transaction; a store found broken is replaced first.

        A store another run is writing is left alone (the cache is only an optimization).
        """
        for attempt in range(1, attempts + 1):
            try:
                if self.broken and attempt == 1:
                    self._replace()
                db = self._connect()
                db.execute("BEGIN IMMEDIATE")
                try:
                    write(db)
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                return True
            except sqlite3.OperationalError as e:
                if "locked" in str(e) or "busy" in str(e):
                    self.note(f"blob cache {self.path} is busy (another run writes it); {busy}")
                    return False
                self._broken("cannot be written", e)
            except sqlite3.Error as e:
                self._broken("cannot be written", e)
        return False

    def _trim(self, db: sqlite3.Connection, keep: set[str]) -> None:
        (count,) = db.execute("SELECT count(*) FROM pack_entries").fetchone()
        excess = int(count) - MAX_ENTRIES
        if excess <= 0:
            return
        old = [b for (b,) in db.execute("SELECT blob FROM pack_entries ORDER BY stamp").fetchall() if b not in keep]
        db.executemany(
            "DELETE FROM pack_entries WHERE version = ? AND blob = ?", [(self.version, b) for b in old[:excess]]
        )

    def _replace(self) -> None:
        """A database that cannot be read is removed and made again (it held nothing we could use)."""
        self.close()
        for suffix in ("", "-journal", "-wal", "-shm"):
            try:
                os.unlink(str(self.path) + suffix)
            except FileNotFoundError:
                pass
            except OSError as e:
                self.note(f"blob cache {self.path}: cannot remove the damaged file: {e.strerror}")
        self.broken = False


@dataclass(frozen=True, slots=True)
class Encoded:
    """A pack's payload, made where its files were parsed (a pool worker), and the blob ids it holds.

    Each blob id is the git blob id of the bytes beside it in the pack
    (`encoded`): `put_packs` indexes a pack under exactly those.
    """

    blobs: tuple[str, ...]
    payload: bytes


# One file in a pack: its bytes, the reader's problems, its documents.
Packed = tuple[bytes, tuple[Found, ...], tuple[TypedDoc, ...]]


def encoded(files: Sequence[Packed]) -> Encoded:
    """The pack of these files (pure: a parse worker makes it beside the parse).

    Models need pickle; the tag byte leaves room for another encoding.
    """
    items = tuple((git_blob_id(data), data, problems, docs) for data, problems, docs in files)
    return Encoded(tuple(item[0] for item in items), _PICKLE + pickle.dumps((FORMAT, items), protocol=5))


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


def _start_time(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, /proc), None when unknown or not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw.rpartition(b")")[2].split()  # after the command name, which may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


def _writer_tag(pid: int) -> str:
    """`<pid>-<start time>`: names a writer uniquely, even once its pid is reused."""
    return f"{pid}-{_start_time(pid) or 0}"


def _writer_alive(tag: str) -> bool:
    """Whether the writer a temp file names still runs (an unreadable name counts as alive: kept)."""
    pid_text, _, started = tag.partition("-")
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # exists, another user's
    now = _start_time(pid)
    return not (started and started != "0" and now is not None and now != started)  # pid reused: the writer died


def git_blob_id(data: bytes) -> str:
    """git's name for these bytes (`git hash-object`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def open_store(
    directory: Path | None = None, *, note: Note | None = None, trees: Iterable[Path] = ()
) -> DiskStore | None:
    """The cache under `directory` (default `default_dir()`); None when it is not safe to use (`note` says why).

    Refused inside any git checkout or any of `trees` (what the command reads):
    its trust (the key) must never come from the files being planned.
    """
    say = note or _stderr_note
    directory = Path(directory) if directory is not None else default_dir()
    inside = checkout_holding(directory, trees)
    if inside is not None:
        say(
            f"blob cache {directory}: not used: it lies inside {inside} (a git checkout or the tree being read), "
            f"whose files could supply their own cache and key; parsing without it. Keep the cache outside every "
            f"repository: --cache-dir DIR, $GPUAAS_STATE_DIR, or the default "
            f"${{XDG_CACHE_HOME:-~/.cache}}/gpuaas/cache"
        )
        return None
    try:
        _private_dir(directory)
        secret = _secret(directory / KEY_NAME)
    except _Unsafe as e:
        say(f"blob cache {directory}: {e}; parsing without it")
        return None
    except OSError as e:
        say(f"blob cache {directory}: cannot be used ({e.strerror or e}); parsing without it")
        return None
    return DiskStore(directory, secret, reader_version(), say)


def _stderr_note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


class _Unsafe(Exception):
    pass


def _owned_private(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise _Unsafe(f"{what} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o022:
        raise _Unsafe(f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


def _private_dir(directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise _Unsafe("is not a directory (a symlink or a file)")
    _owned_private(st, "the directory")


def _read_private(path: Path, size: int) -> bytes | None:
    """The bytes of a file of ours (regular, not writable by others, `size` long), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        try:
            _owned_private(st, path.name)
        except _Unsafe:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return None
        data = f.read(size + 1)
    return data if len(data) == size else None


def _private_file(path: Path) -> None:
    """Create `path` 0600 if missing; refuse a symlink, a non-regular file, or one another user can write."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise sqlite3.OperationalError(f"{path} is a symbolic link") from e
        raise sqlite3.OperationalError(f"{path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise sqlite3.OperationalError(f"{path} is not a regular file")
        try:
            _owned_private(st, path.name)
        except _Unsafe as e:
            raise sqlite3.OperationalError(str(e)) from e
    finally:
        os.close(fd)


def _secret(path: Path) -> bytes:
    """The HMAC key: made once (O_EXCL, 0600, written then renamed into place), then only read."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(wfd, secrets.token_bytes(KEY_BYTES))
                os.fsync(wfd)
            finally:
                os.close(wfd)
            try:
                os.link(tmp, path)  # never replaces a key another run made first
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
            continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Unsafe("the key file is a symbolic link") from e
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Unsafe("the key file is not a regular file")
            _owned_private(st, "the key file")
            if st.st_mode & 0o044:
                raise _Unsafe(f"the key file is readable by group or others (mode {stat.S_IMODE(st.st_mode):o})")
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            raise _Unsafe("the key file is damaged (wrong length); remove the cache directory to start afresh")
        return key
    raise _Unsafe("the key file keeps disappearing")
