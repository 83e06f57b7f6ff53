"""A PR plan's base, kept for the next `gpuaas plan --offline` against the same base commit.

CI plans every pull request against the tip of main, and on a large fleet
the base side of a plan is most of its cost even from the blob cache: every
slot-map model read from packs, every node's placement facts and packing
index built, base planned, its capacity read model and every slot's
schedulability computed. Yet all of it is a pure function of the base
commit, the path in the repo, `--policy` and the code. So once a base has
been planned twice (its checked tree was stored: the first run's cache
writes stay as cheap as before), the second run keeps that base's world:

- the tree as read (paths, documents, models; `desired.reading.deltas.Tree`), so
  head is read by delta from it (`git diff-tree`: only the files the PR
  changes are parsed and validated);
- base's cross-file problems and shared MACs (`policies.validationmemo.Memo`);
- the claims base implies offline, and the base side of the plan
  (`prplan.BaseSide`: base's pending requests, capacity, per-node capacity
  parts, slot schedulability, every node's mode);
- the placement engine brought to base with those claims
  (`replanning.WarmPlanner.suspend`), which head's plan syncs by delta.

A PR reads a file or two of a tree of 20,000: each file's documents (and
the slot maps, which only files hold) are pickled on their own and read on
first use (`reconciler.caches.lazymap`), as are the state's sources (where
each document is: path number and position). The core the plan always
needs (the state's tables of models, the planned side, the engine) is one
pickle; a file's documents name the core's models by (kind, name), so a
file read later gives the very objects the state holds. A plan that reads
every file (a slot map edit validates them all) gets exactly what the eager
tables gave.

Never trusted, like the rest of the cache: the row's HMAC under the store's
secret key (its own domain, `Store.put_file`) is checked before a byte
is unpickled, and the unpickler knows only the classes a base's world is
made of (`reconciler.caches.worldpickle`: the pickled forms that load
quickest, and the allow-list). Anything odd is a miss: the base is read and planned again. Only a
base that read without parse problems or errors is kept (a head is read by
delta only from such a tree), and only the newest `MAX_WORLDS` are kept.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import logging
import pickle
import struct
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from desired.reading import documents
from desired.state import TABLES, Key
from reconciler.caches import cachefiles, worldpickle

if TYPE_CHECKING:
    from desired.problems import Problem
    from desired.reading.documents import Tree
    from desired.state import DesiredState
    from reconciler import plans
    from reconciler.caches.blobpacks import DiskStore
    from reconciler.placement.prplan import BaseSide
    from reconciler.placement.replanning import WarmPlanner

log = logging.getLogger("gpuaas.plan")

FORMAT = 2
CHUNK = 64  # files per pickle kept apart: a file read costs reading its chunk
_EAGER = 0xFFFFFFFF  # chunk_of of a file kept in the core


def key(path: Path, commit: str, policy: str | None) -> str:
    """Where the world of base `commit` is kept: the path in the repo and the policy are inputs too."""
    from reconciler.caches import planresults

    parts = ("base-world", str(FORMAT), planresults.code_version(), commit, str(path.resolve()), policy or "")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class World:
    """A kept base, restored: its state (slot maps lazy), tree, problems and planned side."""

    tree: Tree
    found: list[Problem]  # cross-file problems (warnings only: a base with errors is not kept)
    owners: dict[str, list[tuple[str, int]]]
    observed: plans.Observed
    side: BaseSide
    planner: WarmPlanner

    @property
    def state(self) -> DesiredState:
        return self.tree.state


# ------------------------------------------------------------------ writing


def dump(
    tree: Tree,
    *,
    found: list[Problem],
    owners: Mapping[str, list[tuple[str, int]]],
    observed: plans.Observed,
    side: BaseSide,
    planner: WarmPlanner,
) -> bytes | None:
    """The payload that `load` restores, or None when this tree cannot be kept (logged)."""
    suspended = planner.suspend()
    intern = worldpickle.interner()
    if tree.problems or suspended is None:
        return None
    state = tree.state
    paths = list(tree.by_path)
    refer = _table_models(state)
    apart: list[tuple[str, Any]] = []  # path, its documents: kept apart (read when a plan reads the file)
    eager: dict[str, Any] = {}
    # A core model reached from a file other than as a document's own would be two objects: refused.
    # Not interned (a file is read rarely) and not compressed (its documents' bytes are already).
    pickled = worldpickle.dumper(refuse=refer.keys(), intern=worldpickle.as_is)
    try:
        for path, blob in tree.by_path.items():
            if blob.docs and not blob.file_problems:
                apart.append((path, _apart(blob, refer)))
            else:
                eager[path] = blob
        # files in runs of CHUNK: one pickle each (20,000 pickles cost the run that keeps a base seconds)
        chunks = [pickled(apart[i : i + CHUNK]) for i in range(0, len(apart), CHUNK)]
        sources = _positions(tree)
    except (worldpickle.Leak, pickle.PicklingError, TypeError, AttributeError, _NotKept) as e:
        log.info("base world not kept: %s", e)
        return None
    where: dict[str, tuple[str, int]] = {}  # slot map name -> (its file, position among the file's documents)
    chunk_of = array.array("I", [_EAGER]) * len(paths)  # per path: the chunk holding its file
    number = {path: i for i, path in enumerate(paths)}
    for i, (path, _) in enumerate(apart):
        chunk_of[number[path]] = i // CHUNK
    for name in state.slot_maps:
        file, index = sources.where[("SlotMap", name)]
        if file not in eager:
            where[name] = (file, index)
    kept_maps = {name: smap for name, smap in state.slot_maps.items() if name not in where}
    core = {
        "format": FORMAT,
        "origin": tree.origin,
        "revision": tree.revision,
        "paths": paths,
        "chunk_of": chunk_of.tobytes(),
        "eager": eager,
        "fleet": state.fleet,
        "skus": state.skus,
        "images": state.images,
        "nodes": state.nodes,
        "slot_maps": list(state.slot_maps),
        "kept_maps": kept_maps,
        "where": where,
        "allocations": state.allocations,
        "source_keys": sources.keys,
        "source_at": sources.at,
        "state_revision": state.revision,
        "file_count": state.file_count,
        "found": found,
        "owners": dict(owners),
        "observed": observed,
        "side": _interned_side(side, intern),
        "planner": suspended,
    }
    lazy_ids = {id(smap) for name, smap in state.slot_maps.items() if name in where}
    try:
        core_bytes = worldpickle.dumps(core, refuse=lazy_ids, intern=intern)
    except (worldpickle.Leak, pickle.PicklingError, TypeError, AttributeError) as e:
        log.info("base world not kept: %s", e)
        return None
    return _frame(core_bytes, chunks)


def _apart(blob: Any, refer: Mapping[int, tuple[str, str]]) -> tuple[Any, ...]:
    """A file's documents as kept apart: each model the core keeps named by (kind, name), the others as they are."""
    docs, named = [], []
    for i, (doc, model, found) in enumerate(blob.docs):
        ref = refer.get(id(model))
        if ref is not None:
            named.append((i, *ref))
        docs.append((doc, None if ref is not None else model, found))
    return docs, named, blob.generation


class _NotKept(Exception):
    """The tree is not as a reader leaves it (a source that is not its file's document): not kept."""


def _table_models(state: DesiredState) -> dict[int, tuple[str, str]]:
    """id -> (kind, name) of every model the core keeps in the state's tables (slot maps stay in their files)."""
    refer: dict[int, tuple[str, str]] = {}
    if state.fleet is not None:
        refer[id(state.fleet)] = ("Fleet", state.fleet.name)
    for kind, attr in TABLES.items():
        if kind != "SlotMap":
            refer.update((id(model), (kind, name)) for name, model in getattr(state, attr).items())
    return refer


@dataclass(frozen=True, slots=True)
class _Positions:
    keys: list[Key]  # every source's key, in the state's order
    at: bytes  # array("I"): (path number, position among the file's documents) per key
    where: dict[Key, tuple[str, int]]


def _positions(tree: Tree) -> _Positions:
    """Where every source's document is in the tree.

    A restored source is that document again (`Source(doc, id(model))`):
    only a tree whose every source is one of its files' documents is kept.
    """
    number = {path: i for i, path in enumerate(tree.by_path)}
    place = {id(doc): (path, i) for path, blob in tree.by_path.items() for i, (doc, _, _) in enumerate(blob.docs)}
    keys: list[Key] = []
    at = array.array("I")
    where: dict[Key, tuple[str, int]] = {}
    for key, source in tree.state.sources.items():
        found = place.get(id(source.doc))
        if found is None:
            raise _NotKept(f"the source of {key[0]} {key[1]!r} is not a document of the tree")
        path, index = found
        if source.model_id != id(tree.by_path[path].docs[index][1]):
            raise _NotKept(f"{key[0]} {key[1]!r} is not the model its document was typed to")
        keys.append(key)
        at.extend((number[path], index))
        where[key] = found
    return _Positions(keys, at.tobytes(), where)


def _interned_side(side: BaseSide, intern: Callable[[Any], Any]) -> BaseSide:
    """`side` with its per-slot answers and node modes interned (a few distinct values, 100,000 tuples).

    Nodes whose slots are all answered alike (most of a fleet) share one read-only table of them: one
    object pickled, not 10,000 dicts of 8 entries made again on every load.
    """
    shared: dict[Any, Mapping[int, Any]] = {}

    def one(slots: Mapping[int, Any]) -> Mapping[int, Any]:
        table = {i: intern(v) for i, v in slots.items()}
        return shared.setdefault(intern(tuple(table.items())), types.MappingProxyType(table))

    return dataclasses.replace(
        side,
        schedulable={node: one(slots) for node, slots in side.schedulable.items()},
        modes={node: intern(mode) for node, mode in side.modes.items()},
    )


# The payload: a header, the core pickle, an index (per chunk of CHUNK files kept apart: offset, length
# and SHA-256 of its pickle), then the chunks back to back. The store's HMAC covers header, core and
# index (`Store.put_file(signed=...)`); a chunk's bytes are read and checked against the index when a
# plan first reads one of its files.
_MAGIC = b"gpuaas-world\0"
_HEADER = struct.Struct(f"<{len(_MAGIC)}sIQQ")  # magic, format, core length, index length
_ENTRY = struct.Struct("<QQ32s")


def _frame(core: bytes, chunks: list[bytes]) -> bytes:
    index = bytearray()
    at = 0
    for data in chunks:
        index += _ENTRY.pack(at, len(data), hashlib.sha256(data).digest())
        at += len(data)
    return b"".join([_HEADER.pack(_MAGIC, FORMAT, len(core), len(index)), core, index, *chunks])


def _signed(payload: bytes) -> int:
    """How many leading bytes of a payload the store's HMAC covers: header, core and index."""
    _, _, core_len, index_len = _HEADER.unpack_from(payload)
    return int(_HEADER.size + core_len + index_len)


def _unframe(part: Any) -> tuple[Callable[[], Any], Callable[[int], bytes]] | None:
    """What unpickles the core, and what gives chunk number i's checked bytes; None: not a frame.

    `part`: a `cachefiles.SignedFile` (head verified, the rest read by offset) or plain trusted bytes.
    """
    head = part.head if isinstance(part, cachefiles.SignedFile) else part
    size = part.size if isinstance(part, cachefiles.SignedFile) else len(part)
    if len(head) < _HEADER.size:
        return None
    magic, version, core_len, index_len = _HEADER.unpack_from(head)
    start = _HEADER.size + core_len + index_len
    if magic != _MAGIC or version != FORMAT or start > len(head) or index_len % _ENTRY.size:
        return None
    view = memoryview(head)
    index = view[_HEADER.size + core_len : start]

    def file_bytes(number: int) -> bytes:
        if not 0 <= number < len(index) // _ENTRY.size:
            raise pickle.UnpicklingError(f"no chunk {number} in the index")
        at, length, digest = _ENTRY.unpack_from(index, number * _ENTRY.size)
        if start + at + length > size:
            raise pickle.UnpicklingError(f"index entry {number} is out of bounds")
        if isinstance(part, cachefiles.SignedFile):
            return part.read_checked(start + at, length, digest)
        return bytes(view[start + at : start + at + length])

    def core() -> Any:
        if isinstance(part, cachefiles.SignedFile):
            return worldpickle.load(part.stream(_HEADER.size))  # the unpickler stops at the core's end
        return _loads(view[_HEADER.size : _HEADER.size + core_len])

    return core, file_bytes


def _loads(data: bytes | memoryview) -> Any:
    return worldpickle.loads(data)


def load(payload: bytes | cachefiles.SignedFile, policy: str | None) -> World | None:
    """The world a payload holds, or None when it is not exactly what `dump` writes.

    From a signed record, a file whose bytes fail their check later raises
    `cachefiles.Damaged` where it is read (the command plans again without it).
    """
    try:
        return _restore(payload, policy)
    except Exception as e:  # a kept base is an optimization: whatever is odd, plan without it
        log.info("kept base not used: %s: %s", type(e).__name__, e)
        return None


def _restore(payload: bytes | cachefiles.SignedFile, policy: str | None) -> World | None:
    from desired.state import DesiredState
    from reconciler import plans
    from reconciler.placement.prplan import BaseSide
    from reconciler.placement.replanning import WarmPlanner

    framed = _unframe(payload)
    if framed is None:
        return None
    load_core, file_bytes = framed
    core = load_core()
    if not (
        isinstance(core, dict)
        and core.get("format") == FORMAT
        and isinstance(core.get("side"), BaseSide)
        and isinstance(core.get("observed"), plans.Observed)
        and isinstance(core.get("planner"), tuple)
        and all(isinstance(core.get(k), dict) for k in ("eager", "where", "kept_maps"))
        and all(isinstance(core.get(k), list) for k in ("paths", "source_keys", "slot_maps"))
        and isinstance(core.get("source_at"), bytes)
        and isinstance(core.get("chunk_of"), bytes)
        and len(core["chunk_of"]) == 4 * len(core["paths"])
    ):
        return None
    at = array.array("I")
    at.frombytes(core["source_at"])
    if len(at) != 2 * len(core["source_keys"]):
        return None
    state = DesiredState(
        fleet=core["fleet"],
        skus=core["skus"],
        images=core["images"],
        nodes=core["nodes"],
        allocations=core["allocations"],
        revision=core["state_revision"],
        file_count=core["file_count"],
    )
    files = _Files(core, state, file_bytes, at)
    tree = documents.Tree(core["origin"], core["revision"], cast(dict[str, Any], files.by_path), state, ())
    planner = WarmPlanner.resume(core["planner"], state, policy)
    return World(tree, list(core["found"]), core["owners"], core["observed"], core["side"], planner)


class _Files:
    """A restored world's files, read on first use, and the sources and slot maps found in them.

    All memoized: a base and the head read by delta from it share one
    object per file and document (`deltas` finds a changed file's documents
    in the state by identity), and a file's models are the core's own.
    """

    def __init__(self, core: dict[str, Any], state: DesiredState, file_bytes: Callable[[int], bytes], at: Any) -> None:
        from reconciler.caches.lazymap import LazyMap

        self.state, self.paths, self.where, self.file_bytes = state, core["paths"], core["where"], file_bytes
        keys: list[Key] = core["source_keys"]
        self.keys, self.at = keys, at
        self.positions: dict[Key, tuple[int, int]] | None = None  # built when a source is first read
        self.numbers: dict[str, int] = {}
        self.chunk_of = array.array("I")
        self.chunk_of.frombytes(core["chunk_of"])
        self.made_sources: dict[Key, Any] = {}
        self.by_path: LazyMap[str, Any] = LazyMap(self.paths, self.blob)
        self.by_path.update(core["eager"])
        slot_maps: LazyMap[str, Any] = LazyMap(core["slot_maps"], self.slot_map)
        slot_maps.update(core["kept_maps"])
        state.slot_maps = cast(dict[str, Any], slot_maps)
        state.sources = cast(dict[Key, Any], LazyMap(keys, self.source))
        self.made: dict[str, Any] = {}

    def blob(self, path: str) -> Any:
        got = self.made.get(path)
        if got is None:
            if not self.numbers:
                self.numbers = {p: i for i, p in enumerate(self.paths)}
            for name, (docs, named, generation) in _loads(self.file_bytes(self.chunk_of[self.numbers[path]])):
                for i, kind, model in named:
                    doc, _, found = docs[i]
                    docs[i] = (doc, self.model(kind, model), found)
                self.made[name] = documents.Blob(name, [], docs, generation)  # kept apart: no problem of its own
            got = self.made[path]
        return got

    def model(self, kind: str, name: str) -> Any:
        """The core's model a file names by (kind, name)."""
        if kind == "Fleet":
            if self.state.fleet is None or self.state.fleet.name != name:
                raise pickle.UnpicklingError(f"no Fleet {name!r} in the kept base")
            return self.state.fleet
        table = TABLES.get(kind)
        if table is None or kind == "SlotMap" or name not in getattr(self.state, table):
            raise pickle.UnpicklingError(f"no {kind} {name!r} in the kept base")
        return getattr(self.state, table)[name]

    def slot_map(self, name: str) -> Any:
        path, index = self.where[name]
        return self.by_path[path].docs[index][1]

    def source(self, key: Key) -> Any:
        from desired.state import Source

        got = self.made_sources.get(key)
        if got is None:
            if self.positions is None:  # a request's plan reads no source of base: 20,000 entries not built
                at = self.at
                self.positions = dict(zip(self.keys, zip(at[0::2], at[1::2], strict=True), strict=True))
            number, index = self.positions[key]
            doc, typed, _ = self.by_path[self.paths[number]].docs[index]
            got = self.made_sources[key] = Source(doc, id(typed))
        return got


# ------------------------------------------------------------------ the command's side


def get(store: DiskStore | None, world_key: str | None, policy: str | None) -> World | None:
    if store is None or world_key is None:
        return None
    part = store.get_file_part("worlds", world_key)
    return load(part, policy) if part is not None else None


def put(store: DiskStore, world_key: str, payload: bytes | None) -> None:
    if payload is not None:
        store.put_file("worlds", world_key, payload, signed=_signed(payload))
