"""The cache store: one SQLite database and key per state dir, holding HMAC-signed records by namespace.

Every on-disk cache of the central side lives here, each under its own
namespace: the packs of parsed blobs (`reconciler.caches.blobpacks`),
checked trees and finished offline plans (namespace `results`:
`reconciler.caches.checkedtrees`, `reconciler.caches.planresults`), the
kept bases of PR plans (namespace `worlds`, payloads in files beside the
database: `reconciler.caches.keptworlds`) and the service's last status
documents (`capacity_documents`, files too: `reconciler.service.keptcapacity`).
The store gives bytes back only once their HMAC verifies; what the bytes mean is each client's business.

The directory is `$GPUAAS_STATE_DIR/cache`, else
`${XDG_CACHE_HOME:-~/.cache}/gpuaas/cache`. The cache is an optimization and
is never trusted:

- the cache, and so its key, is never inside a git checkout or the tree a
  command reads (`open_store` refuses it and says where it goes instead):
  the trust in a record must never come from the files being planned;
- every record carries an HMAC-SHA256 under a random key this product makes
  on first use (`key`, mode 0600), over its namespace, its key and its
  payload: a record this user's runs did not write (foreign), or a damaged
  one, fails the check and is a miss; one namespace's record never passes
  for another's;
- the directory must be ours and writable by nobody else, the files ours
  with mode 0600 and no symlinks; otherwise the cache is off for the run
  and `note` says why;
- writes are SQLite transactions (atomic: a run killed mid-write leaves the
  previous content); a database that cannot be read is replaced. They are
  not synced to disk (`synchronous=OFF`): only an OS crash or a power loss
  can damage the file, and damage is a failed HMAC or a replaced database.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import mmap
import os
import secrets
import sqlite3
import stat
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from reconciler import settings
from reconciler.caches import cachefiles

KEY_BYTES = 32
DB_NAME = "blobs.sqlite3"
KEY_NAME = "key"
TEMP_GRACE_S = 600  # a file record's temp file older than this, whose writer is dead, is removed
# The namespaces of keyed records, and how many of each are kept (the newest win).
RECORDS = {"results": 64}  # whole command results: checked trees, finished offline PR plans
FILES = {"worlds": 2, "capacity_documents": 4}  # records too large for a row (kept PR-plan bases, tens of MB;
# the service's last status documents, reconciler.service.keptcapacity): one file each
# What a record of each namespace is, in notes to the user.
WHAT = {"results": "result", "worlds": "kept base", "capacity_documents": "kept capacity document"}
MAX_RESULTS = RECORDS["results"]
MAX_WORLDS = FILES["worlds"]

Note = Callable[[str], None]
S = TypeVar("S", bound="Store")


def default_dir() -> Path:
    """Where the caches live unless a command names a directory (`reconciler.settings`)."""
    return settings.current().cache_dir


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


def _record_table(namespace: str) -> str:
    return (
        f"CREATE TABLE IF NOT EXISTS {namespace} (key TEXT PRIMARY KEY, mac BLOB NOT NULL,"
        " payload BLOB NOT NULL, stamp INTEGER NOT NULL) WITHOUT ROWID"
    )


def _file_table(namespace: str) -> str:
    # The payload is a file beside the database (`<namespace less its s>-<key>`): tens of MB read
    # from a chain of SQLite overflow pages is many times slower than one read() of a file.
    return (
        f"CREATE TABLE IF NOT EXISTS {namespace} (key TEXT PRIMARY KEY, mac BLOB NOT NULL,"
        " size INTEGER NOT NULL, stamp INTEGER NOT NULL) WITHOUT ROWID"
    )


class Store:
    """The cache store of one state dir. Open with `open_store`; every failure degrades to a miss.

    A client with tables of its own subclasses it and adds their statements to `SCHEMA`.
    """

    SCHEMA: tuple[str, ...] = tuple(_record_table(ns) for ns in RECORDS) + tuple(_file_table(ns) for ns in FILES)

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
            for statement in self.SCHEMA:
                db.execute(statement)
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _broken(self, what: str, e: Exception) -> None:
        self.note(f"blob cache {self.path}: {what}: {e}; parsing without it")
        self.broken = True
        self.close()

    # ------------------------------------------------------------- records

    def get_record(self, namespace: str, key: str) -> bytes | None:
        """The payload stored under `key` in `namespace` (the caller's hash of every input), if trusted.

        The payload is returned as bytes only after its HMAC verifies; what
        it means (plain JSON, or a pickle the client reads with its own
        allow-list) is the client's business.
        """
        if namespace not in RECORDS:
            raise ValueError(f"no record namespace {namespace!r}")
        row = self._select(f"SELECT mac, payload FROM {namespace} WHERE key = ?", key)  # noqa: S608 - a known name
        return self._trusted(namespace, key, *row) if row is not None else None

    def put_record(self, namespace: str, key: str, payload: bytes) -> None:
        """Store one record; keep only the newest of its namespace (a miss only costs a full run)."""
        if namespace not in RECORDS:
            raise ValueError(f"no record namespace {namespace!r}")
        row = (key, self._record_mac(key, payload, namespace), payload, time.time_ns())

        def write(db: sqlite3.Connection) -> None:
            db.execute(f"INSERT OR REPLACE INTO {namespace} VALUES (?, ?, ?, ?)", row)  # noqa: S608 - a known name
            db.execute(
                f"DELETE FROM {namespace} WHERE key NOT IN "  # noqa: S608 - a known name
                f"(SELECT key FROM {namespace} ORDER BY stamp DESC LIMIT ?)",
                (RECORDS[namespace],),
            )

        self._transaction(write, busy=f"{WHAT.get(namespace, namespace)} not stored")

    def _file_row(self, namespace: str, key: str) -> tuple[Any, Any] | None:
        """The recorded MAC and size of a file record, None when there is none."""
        if namespace not in FILES:
            raise ValueError(f"no file namespace {namespace!r}")
        row = self._select(f"SELECT mac, size FROM {namespace} WHERE key = ?", key)  # noqa: S608 - a known name
        return None if row is None else (row[0], row[1])

    def get_file(self, namespace: str, key: str) -> bytes | None:
        """The payload of a file record, once its HMAC verifies.

        The file must be ours, regular, private and of the recorded size.
        """
        row = self._file_row(namespace, key)
        if row is None:
            return None
        mac, size = row
        return self._trusted(namespace, key, mac, cachefiles.read_private(self._file_path(namespace, key), size))

    def get_file_part(self, namespace: str, key: str) -> cachefiles.SignedFile | None:
        """A file record put with `signed`: its signed bytes, once their HMAC verifies, and the file.

        The rest of the file is the client's to check before it trusts a
        byte of it, from what the signed bytes say (a digest per part:
        `reconciler.caches.keptworlds` reads a few of thousands of parts).
        """
        row = self._file_row(namespace, key)
        if row is None:
            return None
        mac, size = row
        opened = cachefiles.open_private(self._file_path(namespace, key), size) if isinstance(size, int) else None
        signed = int.from_bytes(mac[32:], "big") if isinstance(mac, bytes) and len(mac) == 40 else 0
        if opened is None or not 0 < signed <= size:
            if opened is not None:
                opened.close()
            self.rejected += 1
            return None
        with opened:
            # Mapped, not copied: the bytes verified are those unpickled unless the file is written in place,
            # which only this user can do (mode 0600, ours) and the writer never does (a new file is renamed in).
            try:
                found = cachefiles.SignedFile(mmap.mmap(opened.fileno(), size, access=mmap.ACCESS_READ), signed)
            except (OSError, ValueError):  # an empty or unmappable file
                self.rejected += 1
                return None
        if hmac.compare_digest(mac, self._part_mac(key, found.head, namespace, signed)):
            found.on_damage = lambda: self.drop_file(namespace, key)  # type: ignore[method-assign]
            return found
        found.close()
        self.rejected += 1
        return None

    def put_file(self, namespace: str, key: str, payload: bytes, *, signed: int | None = None) -> None:
        """Store one file record; keep only the newest of its namespace (each may be tens of MB).

        `signed`: the HMAC covers the first `signed` bytes only, and the
        record is read with `get_file_part` (never `get_file`).
        """
        if namespace not in FILES:
            raise ValueError(f"no file namespace {namespace!r}")
        if signed is not None and not 0 < signed <= len(payload):
            raise ValueError(f"signed length {signed} is not within the payload")
        path = self._file_path(namespace, key)
        prefix = _file_prefix(namespace)
        self._sweep_temps(prefix)
        temp = path.with_name(f"{path.name}.{cachefiles.writer_tag(os.getpid())}.tmp")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(temp, path)  # atomic: a reader sees the old file, the new one, or none
        except OSError as e:
            self.note(f"blob cache {self.directory}: {WHAT.get(namespace, namespace)} not stored: {e.strerror or e}")
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return
        mac = (
            self._record_mac(key, payload, namespace)
            if signed is None
            else self._part_mac(key, memoryview(payload)[:signed], namespace, signed)
        )
        row = (key, mac, len(payload), time.time_ns())
        kept: set[str] = set()

        def write(db: sqlite3.Connection) -> None:
            db.execute(f"INSERT OR REPLACE INTO {namespace} VALUES (?, ?, ?, ?)", row)  # noqa: S608 - a known name
            db.execute(
                f"DELETE FROM {namespace} WHERE key NOT IN "  # noqa: S608 - a known name
                f"(SELECT key FROM {namespace} ORDER BY stamp DESC LIMIT ?)",
                (FILES[namespace],),
            )
            kept.update(k for (k,) in db.execute(f"SELECT key FROM {namespace}"))  # noqa: S608 - a known name

        if self._transaction(write, busy=f"{WHAT.get(namespace, namespace)} not stored"):
            # Files no row names: older records, and any a run killed between its file and its row left.
            # (A `.tmp` file may be another run's write in progress: left alone.)
            for stale in self.directory.glob(f"{prefix}*"):
                if not stale.name.endswith(".tmp") and stale.name.removeprefix(prefix) not in kept:
                    with contextlib.suppress(OSError):
                        stale.unlink()

    def drop_file(self, namespace: str, key: str) -> None:
        """Remove a file record (one found damaged): its row, then its file."""
        if namespace not in FILES:
            raise ValueError(f"no file namespace {namespace!r}")

        def write(db: sqlite3.Connection) -> None:
            db.execute(f"DELETE FROM {namespace} WHERE key = ?", (key,))  # noqa: S608 - a known name

        if self._transaction(write, busy=f"{WHAT.get(namespace, namespace)} not removed"):
            with contextlib.suppress(OSError):
                self._file_path(namespace, key).unlink()

    def _sweep_temps(self, prefix: str) -> None:
        """Remove the `<prefix>*.tmp` of writers that died mid-write (killed: tens of MB each, left for good).

        Only a file both older than TEMP_GRACE_S and whose writer (the pid and
        start time in its name) no longer runs: never another live run's
        write, even one in another pid namespace sharing this directory.
        """
        now = time.time()
        for temp in self.directory.glob(f"{prefix}*.tmp"):
            owner = temp.name.removesuffix(".tmp").rpartition(".")[2]
            try:
                st = os.lstat(temp)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime > TEMP_GRACE_S and not cachefiles.writer_alive(owner):
                    temp.unlink()
                    self.note(f"blob cache {self.directory}: removed {temp.name}, left by a writer that died")
            except OSError:
                continue

    def _file_path(self, namespace: str, key: str) -> Path:
        if not all(c in "0123456789abcdef" for c in key) or len(key) != 64:
            raise ValueError("a file record's key is a sha256 hex digest")  # never a path from elsewhere
        return self.directory / f"{_file_prefix(namespace)}{key}"

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
            and hmac.compare_digest(mac, self._record_mac(key, payload, table))
        ):
            return payload
        self.rejected += 1
        return None

    def _record_mac(self, key: str, payload: bytes, namespace: str) -> bytes:
        # Its own domain ("result", "world"): a blob pack's MAC can never pass for a result's,
        # nor a result (plain JSON) for a kept base (unpickled).
        # Fed in two parts, the same MAC as over their concatenation: a kept base is tens of MB, not copied.
        mac = hmac.new(self._secret, f"{namespace[:-1]}\0{key}\0".encode(), "sha256")
        mac.update(payload)
        return mac.digest()

    def _part_mac(self, key: str, head: bytes | memoryview, namespace: str, signed: int) -> bytes:
        # Its own domain: `part` stands where a whole record's key is (a key is hex), so neither MAC passes
        # for the other; the signed length is in it and beside it (40 bytes: `get_file` never matches one).
        mac = hmac.new(self._secret, f"{namespace[:-1]}\0part\0{signed}\0{key}\0".encode(), "sha256")
        mac.update(head)
        return mac.digest() + signed.to_bytes(8, "big")

    # ------------------------------------------------------------- writing
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


def _file_prefix(namespace: str) -> str:
    """The name of a file record's file, less its key: `world-` for namespace `worlds`."""
    return f"{namespace[:-1]}-"


def open_store(
    directory: Path | None = None,
    *,
    make: Callable[[Path, bytes, str, Note], S],
    version: Callable[[], str],
    note: Note | None = None,
    trees: Iterable[Path] = (),
) -> S | None:
    """The store under `directory` (default `default_dir()`); None when it is not safe to use (`note` says why).

    `make` builds it (`Store` or a client's subclass) once the directory and
    key are found safe; `version` names the code whose records it reads.
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
    except cachefiles.Unsafe as e:
        say(f"blob cache {directory}: {e}; parsing without it")
        return None
    except OSError as e:
        say(f"blob cache {directory}: cannot be used ({e.strerror or e}); parsing without it")
        return None
    return make(directory, secret, version(), say)


def _stderr_note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def _private_dir(directory: Path) -> None:
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise cachefiles.Unsafe("is not a directory (a symlink or a file)")
    cachefiles.owned_private(st, "the directory")


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
            cachefiles.owned_private(st, path.name)
        except cachefiles.Unsafe as e:
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
                raise cachefiles.Unsafe("the key file is a symbolic link") from e
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise cachefiles.Unsafe("the key file is not a regular file")
            cachefiles.owned_private(st, "the key file")
            if st.st_mode & 0o044:
                raise cachefiles.Unsafe(
                    f"the key file is readable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
                )
            key = os.read(fd, KEY_BYTES + 1)
        finally:
            os.close(fd)
        if len(key) != KEY_BYTES:
            raise cachefiles.Unsafe(
                "the key file is damaged (wrong length); remove the cache directory to start afresh"
            )
        return key
    raise cachefiles.Unsafe("the key file keeps disappearing")
