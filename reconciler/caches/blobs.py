"""Parsed and typed blobs kept in memory between revisions: the watch loop, the portal bot, PR plans.

A git blob id names a file's bytes, so what the reader and typing made of
them can be kept under that id and reused by every later revision holding
the same bytes. The reader (`desired.reading.loading`) takes a BlobCache
through its `BlobMemory` Protocol.
"""

from __future__ import annotations

from desired.reading.documents import Blob, Tree, renamed
from desired.reading.packs import Codec
from reconciler.caches import blobpacks
from reconciler.caches.blobpacks import DiskStore


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
        self._blobs: dict[str, Blob] = {}
        # False: documents hold no plain value after typing (`gpuaas run`: memory follows the models)
        self.keep_values = keep_values
        # True: the reader wants the models alone, never a plain value (a CLI command without the disk
        # store): a pool's models cross the pipe in packs, as with the store, and no value with them.
        self.models_only = models_only
        self.generation = 0
        self.hits = 0
        self.misses = 0
        # Reader output on disk (CLI runs): read before parsing, written after (`reconciler.caches.blobpacks`).
        self.disk = disk
        self.tree: Tree | None = None  # the last tree read whole or by delta (desired.reading.deltas)
        self.last_full = ""  # why the last revision was read whole rather than by delta

    @property
    def codec(self) -> Codec | None:
        """Models cross the parse pool's pipe inside packs when the disk keeps them, or when no value is wanted."""
        return self.disk.codec if self.disk is not None else (blobpacks.CODEC if self.models_only else None)

    def __len__(self) -> int:
        return len(self._blobs)

    def get(self, key: str | None, name: str) -> Blob | None:
        blob = self._blobs.get(key) if key is not None else None
        if blob is None:
            return None
        blob.generation = self.generation
        return blob if blob.name == name else renamed(blob, name)

    def put(self, key: str | None, blob: Blob) -> None:
        if key is not None:
            blob.generation = self.generation
            self._blobs[key] = blob

    def account(self, hits: int, misses: int, *, prune: bool) -> None:
        self.hits += hits
        self.misses += misses
        if prune:
            self._prune()

    def _prune(self) -> None:
        old = self.generation - self.KEEP_GENERATIONS + 1
        for key in [k for k, b in self._blobs.items() if b.generation < old]:
            del self._blobs[key]
