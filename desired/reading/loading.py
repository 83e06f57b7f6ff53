"""Load a desired-state tree into typed models, collecting every problem.

Files come in as (path, bytes) pairs or as `FileRef`s, so the same code
reads a working directory or a git revision (see `desired.reading.gitrepo`).
Loading never stops at the first bad file: a reviewer wants the whole list
in one CI run. A cache of parsed blobs (`BlobMemory`) is optional and handed
in by the caller; this module keeps none of its own.
"""

from __future__ import annotations

import contextlib
import gc
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from desired import problems as p
from desired.reading import parsepool
from desired.reading.documents import Blob, Tree, assemble
from desired.reading.packs import Codec, Encoded, PackStore
from desired.reading.parsepool import Cancel, Cancelled, dressed, parse_all
from desired.reading.safefiles import FileData, blob_id
from desired.reading.yamlio import Document
from desired.state import LoadResult
from schemas import progress

__all__ = ["BlobMemory", "Cancel", "Cancelled", "FileRef", "assemble", "blobs_for", "parse_files", "parse_refs"]


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


class BlobMemory(Protocol):
    """Parsed and typed blobs by content id, kept between revisions (`reconciler.caches.blobs.BlobCache`).

    The reader asks it for a blob before parsing, gives it what it parsed,
    and leaves the whole tree it read with it (`tree`) for the next revision
    to start from (`desired.reading.deltas`).
    """

    generation: int  # moved on by every whole read; entries unused for a while are dropped
    keep_values: bool  # False: documents keep no plain value once typed (their bytes packed instead)
    models_only: bool  # True: the reader wants models alone, never a plain value
    tree: Tree | None  # the last tree read whole or by delta
    last_full: str  # why the last revision was read whole rather than by delta

    @property
    def disk(self) -> PackStore | None:
        """Packs kept on disk between runs (CLI commands)."""
        ...

    @property
    def codec(self) -> Codec | None:
        """With it, a pool's models cross the pipe inside packs it encodes."""
        ...

    def get(self, key: str | None, name: str) -> Blob | None: ...
    def put(self, key: str | None, blob: Blob) -> None: ...
    def account(self, hits: int, misses: int, *, prune: bool) -> None: ...


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a tree is built.

    Loading makes millions of long-lived, acyclic objects; every full
    collection on the way would walk all of those made so far, which costs
    more than the loading itself on a large tree. Garbage made meanwhile is
    freed by reference counting; the collector runs again afterwards as it was.
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
    cache: BlobMemory | None = None,
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
    refs: Sequence[FileRef],
    *,
    workers: int | None = None,
    cancel: Cancel | None = None,
    cache: BlobMemory | None = None,
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
    cache: BlobMemory | None = None,
    prune: bool = True,
) -> list[Blob]:
    """The parsed and typed blob of every ref, in order (see `parse_refs`).

    `prune=False` reads a few changed files of a kept tree (desired.reading.deltas):
    the cache's generations do not move, so nothing the tree uses is dropped,
    and the new blobs are not added (the tree holds them; a whole read later
    parses the few changed since the last one again).
    """
    if cache is not None and prune:
        cache.generation += 1
    blobs: list[Blob | None] = [cache.get(r.key, r.name) if cache is not None else None for r in refs]
    todo = [i for i, b in enumerate(blobs) if b is None]
    disk = cache.disk if cache is not None else None
    if disk is not None and todo:
        todo = _from_disk(disk, refs, todo, blobs, cache=cache if prune else None, cancel=cancel)
    shown = progress.active()
    parsepool.prestart(len(todo), workers)  # the pool's fork server starts while the files are read
    with shown.phase("read files", len(todo), unit="files") as read:
        files = _read_files(refs, todo, cancel, read)
    # A disk-backed cache (CLI runs) keeps no plain value: the store's packs are made where the
    # files are parsed, and the models cross the pool's pipe inside them (`parsepool._parse_chunk`).
    stored: list[Encoded] | None = [] if disk is not None else None
    models_only = cache is not None and cache.models_only
    results = parse_all(
        files,
        workers,
        cancel,
        pack=cache is not None and not cache.keep_values,
        values=cache is None or (cache.keep_values and disk is None and not models_only),
        packs=stored,
        codec=disk.codec if disk is not None else cache.codec if cache is not None else None,
    )
    with shown.phase("parse files", len(todo), unit="files") as counted:
        try:
            for n, (i, (name, data), (typed, found, packed)) in enumerate(zip(todo, files, results, strict=True)):
                if n % 256 == 0:  # counted in batches: nothing per file reaches the display
                    counted.done = n
                    if cancel is not None and cancel():
                        raise Cancelled
                docs = []
                key = refs[i].key
                if key is None and typed and isinstance(data, bytes):  # a directory read without a cache
                    key = blob_id(data)  # the id git gives these bytes: the same hash either way
                for item in typed:
                    assert isinstance(data, bytes)  # noqa: S101 - only bytes parse to documents
                    doc = Document(name, item.index, item.value, item.line, data, blob=key)
                    docs.append((doc, item.model, item.problems))
                _settle(docs, cache, packed)
                blobs[i] = Blob(name, found, docs)
                if cache is not None and prune:  # a delta's blobs live in its tree: no history piles up here
                    cache.put(refs[i].key, blobs[i])  # type: ignore[arg-type]
                # Its bytes now live (packed) in its documents: the raw copy goes now, not after the
                # last file, or a cold start holds the whole tree's bytes at its peak.
                files[n] = _CONSUMED
            counted.done = len(todo)
        finally:
            # Closed at once, not when the traceback is freed: a Cancelled raised here must not
            # leave the pool's workers running behind it.
            results.close()
    if cache is not None:
        cache.account(len(refs) - len(todo), len(todo), prune=prune)
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


def _from_disk(
    disk: PackStore,
    refs: Sequence[FileRef],
    todo: list[int],
    blobs: list[Blob | None],
    *,
    cache: BlobMemory | None,
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
            (Document(name, index, None, line, entry.data, blob=key), model, dressed(found, name))
            for index, line, model, found in entry.docs
        ]
        _settle(docs, cache, None)
        blobs[i] = Blob(name, dressed(entry.problems, name), docs)
        if cache is not None:
            cache.put(key, blobs[i])  # type: ignore[arg-type]
    return left


def _settle(docs: list[tuple[Document, Any, list[p.Problem]]], cache: BlobMemory | None, packed: bytes | None) -> None:
    """Where the cache says no reader wants them, drop a file's plain values once typed and pack its bytes.

    Positions come from the bytes (`Document.locate` composes them again), so
    only typing reads the value, and a long-lived tree need not hold them.
    The bytes are kept zlib-compressed (one copy per file; `packed`: what a
    pool worker already compressed), since only problem positions read them:
    a watch loop's memory follows the models, not the YAML text.
    """
    if cache is None or cache.keep_values or not docs:
        return
    if packed is None:
        packed = zlib.compress(docs[0][0].data, 1)
    for doc, _model, _found in docs:
        doc.value = None
        doc.data = packed
        doc.packed = True
