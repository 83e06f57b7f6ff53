"""Load a desired-state tree into typed models, collecting every problem.

Files come in as (path, bytes) pairs so the same code reads a working
directory or a git revision (see `desired.gitrepo`). Loading never stops at
the first bad file: a reviewer wants the whole list in one CI run.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gc
import multiprocessing as mp
import os
import stat
import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field, replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from desired import blobstore, patterns
from desired import models as m
from desired import problems as p
from desired.blobstore import DiskStore, Encoded
from desired.yamlio import MAX_FILE_BYTES, Document, YamlProblem, read_documents
from schemas import progress

if TYPE_CHECKING:
    from desired.deltas import Delta, Tree

YAML_SUFFIXES = (".yaml", ".yml")
SKIP_DIRS = frozenset({".git", ".venv", ".gpuaas", "node_modules", "__pycache__"})

_PATTERN_HINTS = {
    m.NAME_RE: "lowercase letters, digits, '.', '_' or '-' (1-63 chars)",
    patterns.PCI_RE: "a PCI address like 0000:1b:00.0",
    patterns.MAC_RE: "a lowercase MAC like 52:54:00:ab:cd:ef",
    m.DIGEST_RE: "64 lowercase hex characters",
    patterns.BY_ID_RE: "a /dev/disk/by-id/<name> path (no '..', no '/', no shell metacharacters)",
    patterns.SSH_KEY_RE: "an OpenSSH public key line",
}


@dataclass(frozen=True, slots=True)
class Source:
    """Where a model came from, for error positions."""

    doc: Document

    @property
    def file(self) -> str:
        return self.doc.file

    @property
    def line(self) -> int:
        return self.doc.line

    def at(
        self, *path: str | int, severity: p.Severity = p.Severity.ERROR, code: str, message: str, value: bool = True
    ) -> p.Problem:
        line, col = self.doc.locate_value(path) if value else self.doc.locate(path)
        return p.Problem(code, message, self.doc.file, line, col, severity)


@dataclass
class DesiredState:
    """Everything one revision of the repo declares, keyed by name."""

    fleet: m.Fleet | None = None
    skus: dict[str, m.Sku] = field(default_factory=dict)
    images: dict[str, m.Image] = field(default_factory=dict)
    nodes: dict[str, m.Node] = field(default_factory=dict)
    slot_maps: dict[str, m.SlotMap] = field(default_factory=dict)
    allocations: dict[str, m.Allocation] = field(default_factory=dict)
    sources: dict[tuple[str, str], Source] = field(default_factory=dict)
    revision: str | None = None
    file_count: int = 0
    # Set when this state was built from an earlier one by `desired.deltas`: what differs from it.
    delta: Delta | None = field(default=None, compare=False, repr=False)

    def source(self, kind: str, name: str) -> Source:
        return self.sources[(kind, name)]


@dataclass
class LoadResult:
    state: DesiredState
    problems: list[p.Problem]

    @property
    def errors(self) -> list[p.Problem]:
        return [x for x in self.problems if x.severity is p.Severity.ERROR]

    @property
    def warnings(self) -> list[p.Problem]:
        return [x for x in self.problems if x.severity is p.Severity.WARNING]


@dataclass(frozen=True, slots=True)
class UnreadFile:
    """A file that is not read at all: a symlink, a FIFO, a device (the reason is reported at its path)."""

    code: str
    message: str


FileData = bytes | UnreadFile


# git's name for these bytes (`git hash-object`): the cache key of a working-tree file.
blob_id = blobstore.git_blob_id


def read_regular(path: Path | str) -> FileData:
    """The bytes of a regular file, never following a symlink, never blocking on a FIFO or device.

    At most MAX_FILE_BYTES + 1 bytes are read (the reader refuses the file by
    size), so a file that grows while it is read cannot exhaust memory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return UnreadFile(p.FILE_SYMLINK, "is a symbolic link; only regular files inside the repo are read")
        return UnreadFile(p.FILE_UNREADABLE, f"cannot be read: {e.strerror}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return UnreadFile(p.FILE_NOT_REGULAR, "is not a regular file (a FIFO, socket or device); it is not read")
        chunks: list[bytes] = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        return UnreadFile(p.FILE_UNREADABLE, f"cannot be read: {e.strerror}")
    finally:
        os.close(fd)


def iter_directory(root: Path) -> Iterator[tuple[str, FileData]]:
    """Yield (relative path, bytes or UnreadFile) for every YAML file under root, sorted.

    Symlinked directories are not entered; they are reported (as UnreadFile) so a
    link out of the repo is visible rather than silently skipped.
    """
    found: list[str] = []
    top = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(top):
        # One relpath per directory, not per file: at 4,000 files relpath's two abspaths were a
        # fifth of the portal bot's request (reconciler.requests reads the whole tree).
        base = os.path.relpath(dirpath, top)
        prefix = "" if base == "." else base + os.sep
        kept = []
        for d in sorted(dirnames):
            if d in SKIP_DIRS or d.startswith("."):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                found.append(prefix + d)
                continue
            kept.append(d)
        dirnames[:] = kept
        found.extend(prefix + name for name in filenames if name.endswith(YAML_SUFFIXES))
    for rel in sorted(found):
        path = os.path.join(top, rel)
        # Only a linked directory lacks the suffix: a file is never lstat'ed twice (read_regular refuses links).
        if not rel.endswith(YAML_SUFFIXES) and os.path.islink(path):
            yield rel, UnreadFile(p.FILE_SYMLINK, "is a symbolic link to a directory; its files are not read")
        else:
            yield rel, read_regular(path)


# Below this many files one process is faster than starting a pool.
PARALLEL_THRESHOLD = 2000
# No progress from the pool for this long: something is wrong with it; parse in this process instead.
WORKER_TIMEOUT_S = 60.0
_POLL_S = 0.25  # how often a wait for the pool looks at `cancel`

Cancel = Callable[[], bool]


class Cancelled(Exception):
    """The caller asked to stop (SIGTERM) while the tree was being parsed; nothing was produced."""


@dataclass(frozen=True, slots=True)
class _Typed:
    """One document as the reader and typing left it: plain value (None when not wanted), model, problems."""

    index: int
    line: int
    value: Any
    model: Any  # None: refused by typing (its problems say why)
    problems: list[p.Problem]


# Reads many blobs by key in one go (git cat-file --batch), in parts so the caller can stop between
# them. A key missing from every part is read by its ref's `read` (oversized, unknown, or a doubt).
ReadMany = Callable[[Sequence[str]], Iterator[dict[str, bytes]]]


@dataclass(frozen=True, slots=True)
class FileRef:
    """A file of a tree: its path, its content id when known (git blob id), and how to read it."""

    name: str
    key: str | None
    read: Callable[[], FileData]
    read_many: ReadMany | None = None  # the same object for every ref of one repository


@dataclass(slots=True)
class _Blob:
    """What one file's bytes parse and type to: reused for every later revision holding the same blob."""

    name: str
    file_problems: list[p.Problem]
    docs: list[tuple[Document, Any, list[p.Problem]]]  # document, its model (None: refused), its problems
    generation: int = 0


class BlobCache:
    """Parsed and typed documents by content id, kept between revisions (the watch loop, PR plans).

    A new revision re-parses only blobs it has not seen. Entries unused for
    two parses are dropped, so memory follows the tree, not its history.
    Without `disk` the cache holds only what this process computed; with it,
    blobs missing from memory are looked up in the on-disk store (only the
    reader's output is kept there; typing runs again on every entry read).
    """

    KEEP_GENERATIONS = 2

    def __init__(self, disk: DiskStore | None = None, *, keep_values: bool = True, models_only: bool = False) -> None:
        self._blobs: dict[str, _Blob] = {}
        # False: documents hold no plain value after typing (`gpuaas run`: memory follows the models)
        self.keep_values = keep_values
        # True: the reader wants the models alone, never a plain value (a CLI command without the disk
        # store): a pool's models cross the pipe in packs, as with the store, and no value with them.
        self.models_only = models_only
        self.generation = 0
        self.hits = 0
        self.misses = 0
        # Reader output on disk (CLI runs): read before parsing, written after (desired.blobstore).
        self.disk = disk
        self.tree: Tree | None = None  # the last tree read whole or by delta (desired.deltas)
        self.last_full = ""  # why the last revision was read whole rather than by delta

    def __len__(self) -> int:
        return len(self._blobs)

    def _get(self, key: str | None, name: str) -> _Blob | None:
        blob = self._blobs.get(key) if key is not None else None
        if blob is None:
            return None
        blob.generation = self.generation
        return blob if blob.name == name else _renamed(blob, name)

    def _put(self, key: str | None, blob: _Blob) -> None:
        if key is not None:
            blob.generation = self.generation
            self._blobs[key] = blob

    def _account(self, hits: int, misses: int, *, prune: bool) -> None:
        self.hits += hits
        self.misses += misses
        if prune:
            self._prune()

    def _prune(self) -> None:
        old = self.generation - self.KEEP_GENERATIONS + 1
        for key in [k for k, b in self._blobs.items() if b.generation < old]:
            del self._blobs[key]


def _renamed(blob: _Blob, name: str) -> _Blob:
    """The same bytes at another path: documents and problems name the new path."""
    docs = [
        (replace(d, file=name, _node=None), model, [replace(x, file=name) for x in found])
        for d, model, found in blob.docs
    ]
    return _Blob(name, [replace(x, file=name) for x in blob.file_problems], docs, blob.generation)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a tree is built.

    Loading makes millions of long-lived, acyclic objects; every full
    collection on the way walked all of those made so far (at 10,000 nodes,
    two thirds of the load time). Garbage made meanwhile is freed by
    reference counting; the collector runs again afterwards as it was.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def parse_files(
    files: Iterable[tuple[str, FileData]],
    *,
    workers: int | None = None,
    cancel: Cancel | None = None,
    cache: BlobCache | None = None,
) -> LoadResult:
    """Parse and type every document of (path, bytes) pairs; see `parse_refs`."""
    refs = [
        FileRef(name, blob_id(data) if cache is not None and isinstance(data, bytes) else None, _constant(data))
        for name, data in files
    ]
    return parse_refs(refs, workers=workers, cancel=cancel, cache=cache)


def _constant(data: FileData) -> Callable[[], FileData]:
    return lambda: data


def parse_refs(
    refs: Sequence[FileRef], *, workers: int | None = None, cancel: Cancel | None = None, cache: BlobCache | None = None
) -> LoadResult:
    """Parse and type every document; cross-file rules run in `policies.validation`.

    With a cache, a file whose content id was parsed before is not read
    again. Large sets of new files are parsed by a pool of workers (libyaml's
    composer is the cost, and it holds the GIL); results are merged in file
    order, so the outcome is identical to a single-process run without a
    cache. `cancel` is polled while reading and parsing: when it returns
    True, Cancelled is raised within a fraction of a second and the workers
    are gone.
    """
    return assemble(blobs_for(refs, workers=workers, cancel=cancel, cache=cache))


def blobs_for(
    refs: Sequence[FileRef],
    *,
    workers: int | None = None,
    cancel: Cancel | None = None,
    cache: BlobCache | None = None,
    prune: bool = True,
) -> list[_Blob]:
    """The parsed and typed blob of every ref, in order (see `parse_refs`).

    `prune=False` reads a few changed files of a kept tree (desired.deltas):
    the cache's generations do not move, so nothing the tree uses is dropped,
    and the new blobs are not added (the tree holds them; a whole read later
    parses the few changed since the last one again).
    """
    if cache is not None and prune:
        cache.generation += 1
    blobs: list[_Blob | None] = [cache._get(r.key, r.name) if cache is not None else None for r in refs]
    todo = [i for i, b in enumerate(blobs) if b is None]
    disk = cache.disk if cache is not None else None
    if disk is not None and todo:
        todo = _from_disk(disk, refs, todo, blobs, cache=cache if prune else None, cancel=cancel)
    shown = progress.active()
    with shown.phase("read files", len(todo), unit="files") as read:
        files = _read_files(refs, todo, cancel, read)
    # A disk-backed cache (CLI runs) keeps no plain value: the store's packs are made where the
    # files are parsed, and the models cross the pool's pipe inside them (`_parse_chunk`).
    stored: list[Encoded] | None = [] if disk is not None else None
    models_only = cache is not None and cache.models_only
    results = _parse_all(
        files,
        workers,
        cancel,
        pack=cache is not None and not cache.keep_values,
        values=cache is None or (cache.keep_values and disk is None and not models_only),
        packs=stored,
        in_packs=disk is not None or models_only,
    )
    with shown.phase("parse files", len(todo), unit="files") as counted:
        try:
            for n, (i, (name, data), (typed, found, packed)) in enumerate(zip(todo, files, results, strict=True)):
                if n % 256 == 0:  # counted in batches: nothing per file reaches the display
                    counted.done = n
                    if cancel is not None and cancel():
                        raise Cancelled
                docs = []
                for item in typed:
                    assert isinstance(data, bytes)  # noqa: S101 - only bytes parse to documents
                    docs.append((Document(name, item.index, item.value, item.line, data), item.model, item.problems))
                _settle(docs, cache, packed)
                blobs[i] = _Blob(name, found, docs)
                if cache is not None and prune:  # a delta's blobs live in its tree: no history piles up here
                    cache._put(refs[i].key, blobs[i])  # type: ignore[arg-type]
                # Its bytes now live (packed) in its documents: the raw copy goes now, not after the
                # last file, or a cold start holds the whole tree's bytes at its peak.
                files[n] = _CONSUMED
            counted.done = len(todo)
        finally:
            # Closed at once, not when the traceback is freed: a Cancelled raised here must not
            # leave the pool's workers running behind it.
            results.close()
    if cache is not None:
        cache._account(len(refs) - len(todo), len(todo), prune=prune)
    if disk is not None and stored:
        disk.put_packs(stored, keep=[r.key for r in refs if r.key is not None] if prune else ())
    return blobs  # type: ignore[return-value]  # every one read or found above


_CONSUMED: tuple[str, FileData] = ("", b"")


def _read_files(
    refs: Sequence[FileRef], todo: list[int], cancel: Cancel | None, shown: progress.Phase | None = None
) -> list[tuple[str, FileData]]:
    """(name, bytes or UnreadFile) of the `todo` refs: in batches where a ref can, else one by one."""
    shown = shown if shown is not None else progress.Phase("read files")
    batched = _read_batched(refs, todo, cancel)  # dropped on return: `files` alone then holds the bytes
    files: list[tuple[str, FileData]] = []
    for n, i in enumerate(todo):
        if n % 256 == 0:
            shown.done = n
            if cancel is not None and cancel():
                raise Cancelled
        ref = refs[i]
        data = batched.get(ref.key) if ref.read_many is not None and ref.key is not None else None
        files.append((ref.name, data if data is not None else ref.read()))
    shown.done = len(files)
    return files


def _read_batched(refs: Sequence[FileRef], todo: list[int], cancel: Cancel | None) -> dict[str, bytes]:
    """Bytes by key of the `todo` refs their `read_many` gave: one call per reader, each key asked once."""
    wanted: dict[ReadMany, dict[str, None]] = {}
    for i in todo:
        ref = refs[i]
        if ref.read_many is not None and ref.key is not None:
            wanted.setdefault(ref.read_many, {})[ref.key] = None
    got: dict[str, bytes] = {}
    for read_many, keys in wanted.items():
        if cancel is not None and cancel():
            raise Cancelled
        for part in read_many(list(keys)):
            if cancel is not None and cancel():
                raise Cancelled
            got.update(part)
    return got


def assemble(blobs: Sequence[_Blob | None]) -> LoadResult:
    """The state the blobs declare, in file order, with every problem (duplicates named at the later file)."""
    state = DesiredState(file_count=len(blobs))
    problems: list[p.Problem] = []
    for blob in blobs:
        assert blob is not None  # noqa: S101 - every file was read or found above
        problems.extend(blob.file_problems)
        for doc, model, found in blob.docs:
            problems.extend(found)
            if model is not None:
                _register(state, doc, model, problems)
    return LoadResult(state, problems)


def _from_disk(
    disk: DiskStore,
    refs: Sequence[FileRef],
    todo: list[int],
    blobs: list[_Blob | None],
    *,
    cache: BlobCache | None,
    cancel: Cancel | None,
) -> list[int]:
    """Fill `blobs` from the on-disk store where it has the blob; the indexes still to parse."""
    entries = disk.get_many([k for k in (refs[i].key for i in todo) if k is not None])
    left: list[int] = []
    for n, i in enumerate(todo):
        if cancel is not None and n % 256 == 0 and cancel():
            raise Cancelled
        key = refs[i].key
        entry = entries.get(key) if key is not None else None
        if entry is None:
            left.append(i)
            continue
        name = refs[i].name
        # Typed when the entry was written (the version it is keyed by names the models' code).
        docs = [
            (Document(name, index, None, line, entry.data), model, _dressed(found, name))
            for index, line, model, found in entry.docs
        ]
        _settle(docs, cache, None)
        blobs[i] = _Blob(name, _dressed(entry.problems, name), docs)
        if cache is not None:
            cache._put(key, blobs[i])  # type: ignore[arg-type]
    return left


# Documents, file problems, the bytes zlib-compressed (see `_settle`).
_Result = tuple[list[_Typed], list[p.Problem], bytes | None]
PACK_FILES = 512  # files per pack made in this process (a pool worker packs its chunk)


def _parse_all(
    file_list: list[tuple[str, FileData]],
    workers: int | None,
    cancel: Cancel | None,
    *,
    pack: bool = False,
    values: bool = True,
    packs: list[Encoded] | None = None,
    in_packs: bool = False,
) -> Generator[_Result, None, None]:
    """Each file's reader output, in order.

    With `pack`, pool workers also compress the bytes (see `_settle`). With
    `packs`, the disk store's packs of these files are added to it. With
    `in_packs`, a pool's models cross the pipe inside packs (`_parse_chunk`).
    """
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1 or len(file_list) < PARALLEL_THRESHOLD or "forkserver" not in mp.get_all_start_methods():
        yield from _parse_here(file_list, values, packs)
        return
    # forkserver, never fork: the caller may run threads (watchfiles' inotify thread, a
    # database pool), and a child forked while another thread holds a lock can wait on it
    # forever. The fork server is a clean single-threaded process that forks the workers.
    # ProcessPoolExecutor, not Pool: a worker that dies breaks the pool (BrokenProcessPool)
    # instead of being replaced behind our back while we wait.
    step = max(1, len(file_list) // (n * 32))
    done = 0
    pool = futures.ProcessPoolExecutor(n, mp_context=_CONTEXT)
    delivered = False
    try:
        # No list of the chunks: a chunk's bytes are let go once its result is taken.
        encode = in_packs or packs is not None
        pending = collections.deque(
            pool.submit(_parse_chunk, file_list[i : i + step], pack, values, encode)
            for i in range(0, len(file_list), step)
        )
        while pending:
            # Taken off the queue: a future keeps its result, and every chunk's plain values held
            # until the last one arrived were a large part of the cold start's peak memory.
            fut = pending.popleft()
            waited = 0.0
            while True:
                if cancel is not None and cancel():
                    raise Cancelled
                try:
                    chunk = fut.result(timeout=_POLL_S)
                    break
                except futures.TimeoutError:
                    waited += _POLL_S
                    if waited >= WORKER_TIMEOUT_S:
                        raise _PoolStuck from None
            results = _unpacked(file_list[done : done + len(chunk[1])], chunk, packs)
            done += len(results)
            yield from results
        delivered = True
    except (_PoolStuck, futures.process.BrokenProcessPool, OSError):
        # Degrade, never hang: the pool goes first (a hung worker must not outlive this
        # parse), then what it did not deliver is parsed here.
        _stop(pool, at_once=True)
        yield from _parse_here(file_list[done:], values, packs)
    finally:
        # Also on Cancelled and on close() by the caller: queued chunks are dropped and
        # the workers are stopped, each wait bounded.
        _stop(pool, at_once=not delivered)


class _PoolStuck(Exception):
    pass


# An idle worker leaves on the shutdown sentinel in milliseconds; one that has not left by
# then is stuck (or busy on work nobody wants any more) and is terminated, then killed.
_LEAVE_S = 1.0
_TERM_S = 0.3


def _stop(pool: futures.ProcessPoolExecutor, *, at_once: bool) -> None:
    """Shut the pool down and reap its workers without ever waiting unbounded.

    `shutdown(wait=True)` joins every worker with no timeout, so one hung
    worker (blocked on a queue lock a dead sibling held, say) hangs the
    caller. Instead: ask the workers to leave, wait briefly (not at all when
    `at_once`), then SIGTERM, then SIGKILL whoever is still there. Killed
    workers make the pool's manager thread tear the queues down itself.
    Calling it again is a no-op.
    """
    # The executor keeps its workers private and offers no way to terminate them before
    # Python 3.14 (terminate_workers()); take them before shutdown() forgets them.
    workers: list[BaseProcess] = list((getattr(pool, "_processes", None) or {}).values())
    manager: threading.Thread | None = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)  # shutdown() drops its reference
    pool.shutdown(wait=False, cancel_futures=True)
    if not at_once:
        _join_all(workers, _LEAVE_S)
    for stop in (BaseProcess.terminate, BaseProcess.kill):
        alive = [w for w in workers if w.is_alive()]
        if not alive:
            break
        for w in alive:
            stop(w)
        _join_all(alive, _TERM_S if stop is BaseProcess.terminate else _LEAVE_S)
    if manager is None:
        return
    manager.join(_TERM_S if at_once else _LEAVE_S)  # it tears the queues down once the workers are gone
    if manager.is_alive():
        # A worker killed in the middle of sending a result leaves half a message in the pipe,
        # and the manager thread blocks reading the rest: for good, since this process holds
        # a write end too, and the interpreter's exit joins that thread (a test run that
        # finished and never exited). Every worker is gone by now, so nothing else writes:
        # with our write end closed it reads EOF, calls the pool broken and leaves.
        writer = getattr(results, "_writer", None)
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
        manager.join(_LEAVE_S)


def _join_all(workers: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))


_CONTEXT = mp.get_context("forkserver") if "forkserver" in mp.get_all_start_methods() else mp.get_context()
if "forkserver" in mp.get_all_start_methods():
    # The fork server imports the parser once, and builds the models' validators (`desired.warm`):
    # every worker it forks starts warm.
    _CONTEXT.set_forkserver_preload(["desired.loading", "desired.warm"])


# What a worker sends back for a chunk: its pack (None: not wanted) and, per file, its documents
# (None: they are in the pack), problems (None: in the pack) and compressed bytes.
_Chunk = tuple[Encoded | None, list[tuple[list[_Typed] | None, list[p.Problem] | None, bytes | None]]]


def _parse_chunk(chunk: list[tuple[str, FileData]], pack: bool, values: bool, encode: bool) -> _Chunk:
    # Typed here, beside the parse: models cross the pipe cheaper than the plain values they
    # come from (their equal strings are one object, see models.compact), and the process
    # that plans does not spend a second typing. Compressing here keeps that off it too.
    # With `encode`, the models cross inside the store's pack: pickled once, not twice.
    out: list[tuple[list[_Typed] | None, list[p.Problem] | None, bytes | None]] = []
    files: list[blobstore.Packed] = []
    for name, data in chunk:
        typed, found = _parse_one(name, data, values)
        packed = zlib.compress(data, 1) if pack and isinstance(data, bytes) else None
        if encode and isinstance(data, bytes):
            files.append(_packed(data, typed, found))
            out.append((None, None, packed))
        else:
            out.append((typed, found, packed))
    return (blobstore.encoded(files) if encode else None), out


def _unpacked(chunk_files: list[tuple[str, FileData]], chunk: _Chunk, packs: list[Encoded] | None) -> list[_Result]:
    """A worker's chunk as per-file results, the documents of packed files read from its pack."""
    encoded, parts = chunk
    entries = blobstore.decode_pack(encoded.payload) if encoded is not None else None
    if encoded is not None:
        if entries is None:
            raise _PoolStuck  # our own worker's pack does not read back: parse here instead
        if packs is not None:
            packs.append(encoded)
    blobs = iter(encoded.blobs if encoded is not None else ())
    out: list[_Result] = []
    for (name, _data), (sent, sent_found, packed) in zip(chunk_files, parts, strict=True):
        if sent is None or sent_found is None:
            entry = entries[next(blobs)]  # type: ignore[index]  # packed files come with a pack
            out.append(
                (
                    [
                        _Typed(index, line, None, model, _dressed(problems, name))
                        for index, line, model, problems in entry.docs
                    ],
                    _dressed(entry.problems, name),
                    packed,
                )
            )
        else:
            out.append((sent, sent_found, packed))
    return out


def _parse_here(file_list: list[tuple[str, FileData]], values: bool, packs: list[Encoded] | None) -> Iterator[_Result]:
    """Parse in this process; with `packs`, add the store's packs of these files to it."""
    files: list[blobstore.Packed] = []
    for name, data in file_list:
        typed, found = _parse_one(name, data, values)
        if packs is not None and isinstance(data, bytes):
            files.append(_packed(data, typed, found))
            if len(files) >= PACK_FILES:
                packs.append(blobstore.encoded(files))
                files = []
        yield typed, found, None
    if packs is not None and files:
        packs.append(blobstore.encoded(files))


def _packed(data: bytes, typed: list[_Typed], found: list[p.Problem]) -> blobstore.Packed:
    """One file as the store's pack holds it."""
    return data, _bare(found), tuple((t.index, t.line, t.model, _bare(t.problems)) for t in typed)


def _parse_one(name: str, data: FileData, values: bool = True) -> tuple[list[_Typed], list[p.Problem]]:
    """Read and type one file. `values`: keep each document's plain value beside its model."""
    if isinstance(data, UnreadFile):
        return [], [p.Problem(data.code, data.message, name, 1, 1)]
    typed: list[_Typed] = []
    found: list[p.Problem] = []
    try:
        for doc in read_documents(name, data):
            doc_problems: list[p.Problem] = []
            model = _type_document(doc, doc_problems)
            typed.append(_Typed(doc.index, doc.line, doc.value if values else None, model, doc_problems))
    except YamlProblem as e:
        found = [p.Problem(e.code, e.message, name, e.line, e.column)]
    return typed, found


def _bare(problems: list[p.Problem]) -> tuple[blobstore.Found, ...]:
    """Problems as the disk store keeps them: without the file (a blob may sit at any path)."""
    return tuple((x.code, x.message, x.line, x.column) for x in problems)


def _dressed(found: tuple[blobstore.Found, ...], name: str) -> list[p.Problem]:
    """The stored problems (`_bare`) of the file at `name`."""
    return [p.Problem(code, message, name, line, col) for code, message, line, col in found]


def _settle(docs: list[tuple[Document, Any, list[p.Problem]]], cache: BlobCache | None, packed: bytes | None) -> None:
    """Where the cache says no reader wants them, drop a file's plain values once typed and pack its bytes.

    Positions come from the bytes (`Document.locate` composes them again), so
    only typing reads the value; a 10,000-node tree held every one of them.
    The bytes are kept zlib-compressed (one copy per file; `packed`: what a
    pool worker already compressed), since only problem positions read them:
    a watch loop holding 100,000 nodes keeps ~80 MB instead of ~430 MB.
    """
    if cache is None or cache.keep_values or not docs:
        return
    if packed is None:
        packed = zlib.compress(docs[0][0].data, 1)
    for doc, _model, _found in docs:
        doc.value = None
        doc.data = packed
        doc.packed = True


def _type_document(doc: Document, problems: list[p.Problem]) -> Any:
    value = doc.value
    if not isinstance(value, dict):
        problems.append(
            p.Problem(
                p.YAML_NOT_MAPPING, "a document must be a mapping with apiVersion and kind", doc.file, doc.line, 1
            )
        )
        return None
    kind = value.get("kind")
    api = value.get("apiVersion")
    if kind is None:
        problems.append(p.Problem(p.DOC_KIND_MISSING, "document has no 'kind'", doc.file, doc.line, 1))
        return None
    model = m.KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        line, col = doc.locate_value(("kind",))
        known = ", ".join(sorted(m.KINDS))
        problems.append(
            p.Problem(p.DOC_KIND_UNKNOWN, f"unknown kind {kind!r}; known kinds: {known}", doc.file, line, col)
        )
        return None
    if api != m.API_VERSION:
        line, col = doc.locate_value(("apiVersion",)) if api is not None else (doc.line, 1)
        problems.append(
            p.Problem(p.DOC_API_VERSION, f"apiVersion must be {m.API_VERSION!r}, got {api!r}", doc.file, line, col)
        )
        return None
    try:
        return m.compact(model.model_validate(value))
    except ValidationError as e:
        problems.extend(_field_problems(doc, e))
        return None


def _register(state: DesiredState, doc: Document, obj: Any, problems: list[p.Problem]) -> None:
    kind, name, table = _identity(state, obj)
    if name in table:
        first = state.sources[(kind, name)]
        line, col = doc.locate_value((_name_field(kind),)) if kind != "Fleet" else (doc.line, 1)
        problems.append(
            p.Problem(
                p.DUPLICATE_NAME if kind != "SlotMap" else p.NODE_SLOTMAP_MULTIPLE,
                f"{kind} {name!r} is already declared at {first.file}:{first.line}",
                doc.file,
                line,
                col,
            )
        )
        return
    table[name] = obj
    state.sources[(kind, name)] = Source(doc)
    if kind == "Fleet":
        if state.fleet is not None:
            problems.append(p.Problem(p.FLEET_MULTIPLE, "only one Fleet document is allowed", doc.file, doc.line, 1))
            return
        state.fleet = obj


def _name_field(kind: str) -> str:
    return {"Sku": "sku", "Image": "slug", "SlotMap": "node", "Allocation": "id"}.get(kind, "name")


def _identity(state: DesiredState, obj: Any) -> tuple[str, str, dict[str, Any]]:
    if isinstance(obj, m.Sku):
        return "Sku", obj.sku, state.skus
    if isinstance(obj, m.Image):
        return "Image", obj.slug, state.images
    if isinstance(obj, m.Node):
        return "Node", obj.name, state.nodes
    if isinstance(obj, m.SlotMap):
        return "SlotMap", obj.node, state.slot_maps
    if isinstance(obj, m.Allocation):
        return "Allocation", obj.id, state.allocations
    fleets: dict[str, Any] = {} if state.fleet is None else {state.fleet.name: state.fleet}
    return "Fleet", obj.name, fleets


def _field_problems(doc: Document, error: ValidationError) -> Iterator[p.Problem]:
    items = error.errors(include_url=False)
    # A list whose only item failed also reports "too short": that echo helps nobody.
    failed = {tuple(i["loc"]) for i in items}
    for item in items:
        loc = tuple(item["loc"])
        if item["type"] == "too_short" and any(f[: len(loc)] == loc and f != loc for f in failed):
            continue
        kind = item["type"]
        dotted = _dotted(loc)
        if kind == "missing":
            line, col = doc.locate(loc[:-1])
            yield p.Problem(p.FIELD_MISSING, f"required field '{dotted}' is missing", doc.file, line, col)
        elif kind == "extra_forbidden":
            line, col = doc.locate(loc)
            yield p.Problem(p.FIELD_UNKNOWN, f"unknown field '{dotted}'", doc.file, line, col)
        elif loc and loc[-1] == "[key]":  # a bad mapping key: point at the key itself, name the mapping
            line, col = doc.locate(loc[:-1])
            yield p.Problem(
                p.FIELD_VALUE, f"key {str(loc[-2])!r} of '{_dotted(loc[:-2])}': {_message(item)}", doc.file, line, col
            )
        else:
            line, col = doc.locate_value(loc)
            code = p.FIELD_TYPE if kind.endswith("_type") or kind.endswith("_parsing") else p.FIELD_VALUE
            yield p.Problem(code, f"field '{dotted or '<document>'}': {_message(item)}", doc.file, line, col)


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(item: Any) -> str:
    if item["type"] == "string_pattern_mismatch":
        pattern = item.get("ctx", {}).get("pattern", "")
        hint = _PATTERN_HINTS.get(pattern, f"must match {pattern}")
        return f"{item['input']!r} is not {hint}" if pattern in _PATTERN_HINTS else hint
    msg = str(item["msg"])
    return msg.removeprefix("Value error, ")
