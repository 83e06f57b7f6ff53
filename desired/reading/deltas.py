"""A revision as the last one plus what changed: assembled at O(change), not O(tree).

`gpuaas run` loads one revision after another of a large tree where a commit
changes a file or two. `loading.parse_refs` walks every file of the tree
(even when every blob comes from the cache); here the last assembled tree is
kept (`Tree`) and a new revision is built from the list of changed paths
(`git diff-tree`, see `desired.reading.gitrepo`): the state's tables are copied (C
speed) and only the documents of changed files are taken out and put in.

The result must equal `parse_refs` over the whole tree: the same tables in
the same (file, document) order, the same sources, the same problems. The
fast path is taken only where that is plain: the kept tree and the changed
files hold no parse problem (no duplicate name, no bad document, no refused
file; cross-file problems are validation's). Anything else returns a
reason, and the caller reads the whole tree.

The result carries a `Delta` beside the state: which (kind, name) keys differ from the
state it was built from, so validation, inventory sync and planning can
work from the change too.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from desired.reading import loading
from desired.reading.documents import Tree
from desired.reading.loading import BlobMemory, FileRef
from desired.state import TABLES, Delta, DesiredState, Key, LoadResult, Source, key_of

# Past this share of the tree changed, a full read costs about what the delta does.
MAX_SHARE = 4
MAX_MIN = 256


def remember(cache: BlobMemory, tree: Tree) -> None:
    """Keep a tree just read whole, so the next revision can start from it."""
    cache.tree = tree


def tree_of(origin: str, revision: str, refs: Sequence[FileRef], blobs: Sequence[Any], result: LoadResult) -> Tree:
    """The Tree of a whole read: `refs` and their `blobs`, in the same order, and what they assembled to."""
    return Tree(
        origin, revision, {r.name: b for r, b in zip(refs, blobs, strict=True)}, result.state, tuple(result.problems)
    )


def apply(
    cache: BlobMemory,
    revision: str,
    changes: Sequence[tuple[str, FileRef | None]],
    *,
    cancel: loading.Cancel | None = None,
) -> LoadResult | str:
    """The kept tree with `changes` (path -> new file, None: gone) applied, or why it cannot be.

    The caller has checked that the kept tree is of this repo and an ancestor's (see `gitrepo`).
    """
    tree = cache.tree
    if tree is None:
        return "no tree kept yet"
    if tree.problems:
        return "the kept revision has problems"
    if len(changes) > max(MAX_MIN, len(tree.by_path) // MAX_SHARE):
        return f"{len(changes)} of {len(tree.by_path)} files changed"
    new_blobs = loading.blobs_for(
        [ref for _, ref in changes if ref is not None], cache=cache, cancel=cancel, prune=False
    )
    for blob in new_blobs:
        if blob.file_problems or any(found or model is None for _, model, found in blob.docs):
            return f"{blob.name} has problems"
    build = _Builder(tree)
    why = build.take_out([path for path, _ in changes]) or build.put_in(new_blobs)
    if why:
        return why
    build.order()
    state = build.state
    cache.tree = Tree(tree.origin, revision, build.by_path, state, (), tree.extra)
    return LoadResult(state, [], Delta(weakref.ref(tree.state), frozenset(build.touched)))


class _Builder:
    """A copy of the kept state (tables copied on first write) that changed files are applied to."""

    def __init__(self, tree: Tree) -> None:
        old = tree.state
        self.state = DesiredState(
            fleet=old.fleet,
            skus=old.skus,
            images=old.images,
            nodes=old.nodes,
            slot_maps=old.slot_maps,
            allocations=old.allocations,
            # .copy(), not dict(): a kept base's LazyMap stays lazy (`reconciler.caches.lazymap`); a dict stays a dict
            sources=old.sources.copy(),
            file_count=old.file_count,
        )
        self.by_path = tree.by_path.copy()
        self.copied: set[str] = set()
        self.removed: dict[Key, Any] = {}  # key -> the document it came from, until put back in place
        self.touched: set[Key] = set()
        self.unordered: set[str] = set()

    def table(self, kind: str) -> dict[str, Any]:
        attr = TABLES[kind]
        if attr not in self.copied:  # copy on write: the old state stays as it was
            setattr(self.state, attr, getattr(self.state, attr).copy())
            self.copied.add(attr)
        t: dict[str, Any] = getattr(self.state, attr)
        return t

    def take_out(self, paths: Sequence[str]) -> str:
        """Note the documents of changed paths as removed (they leave the tables in `put_in`)."""
        sources = self.state.sources
        for path in paths:
            blob = self.by_path.pop(path, None)
            if blob is None:
                continue
            self.state.file_count -= 1
            for doc, model, _ in blob.docs:
                key = _key(model)
                source = sources.get(key)
                if key in self.removed or source is None or source.doc is not doc:
                    return f"{path}: {key[0]} {key[1]!r} is not where the kept tree has it"
                self.removed[key] = doc
        self.touched.update(self.removed)
        return ""

    def put_in(self, blobs: Sequence[Any]) -> str:
        """Register the documents of new files; replaced documents keep their place, removed ones go."""
        appended: list[tuple[Key, Any, Any]] = []
        for blob in blobs:
            self.by_path[blob.name] = blob
            self.state.file_count += 1
            for doc, model, _ in blob.docs:
                key = _key(model)
                self.touched.add(key)
                was = self.removed.get(key)
                if was is not None and (was.file, was.index) == (doc.file, doc.index):
                    del self.removed[key]  # the same place in file order: replaced where it stands
                    self._set(key, model, doc)
                else:
                    appended.append((key, doc, model))
        for kind, name in self.removed:
            if kind == "Fleet":
                self.state.fleet = None
            else:
                del self.table(kind)[name]
            del self.state.sources[(kind, name)]
        for key, doc, model in appended:
            if key in self.state.sources or (key[0] == "Fleet" and self.state.fleet is not None):
                return f"{doc.file}: {key[0]} {key[1]!r} is declared twice"
            if key[0] != "Fleet":
                t = self.table(key[0])
                if t and _position(self.state.sources[(key[0], next(reversed(t)))]) > (doc.file, doc.index):
                    self.unordered.add(key[0])
            self._set(key, model, doc)
        return ""

    def _set(self, key: Key, model: Any, doc: Any) -> None:
        kind, name = key
        if kind == "Fleet":
            self.state.fleet = model
        else:
            self.table(kind)[name] = model
        self.state.sources[key] = Source(doc, id(model))

    def order(self) -> None:
        """Tables that got a document before the end of file order: sorted as a full read has them."""
        sources = self.state.sources
        for kind in self.unordered:
            t = self.table(kind)
            order = sorted(t, key=lambda n, kind=kind: _position(sources[(kind, n)]))  # type: ignore[misc]
            setattr(self.state, TABLES[kind], {n: t[n] for n in order})


def _key(model: Any) -> Key:
    return key_of(model)


def _position(source: Source) -> tuple[str, int]:
    return source.doc.file, source.doc.index
