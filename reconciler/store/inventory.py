"""Inventory sync: project the desired state at a revision into rows.

Upsert what git declares, mark `present = false` what disappeared (rows that
claims or billing reference are never deleted), and record the revision.
The sync reads the current rows first and writes only the differences, so
re-running the same revision takes no row lock and writes nothing at all,
and placements running beside it never lose a race to a no-op.

Each row remembers the revision that last changed it (`revision`); the
`desired_revisions` table remembers every revision synced and its content
hash (a plain directory without git is recorded as `tree:<hash>`). The rows
each document becomes and the content hash: store/inventoryrows.py; how the
differences are written (COPY on a cold sync): store/inventorywrites.py.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from desired.state import Delta, DesiredState, delta_since
from reconciler.store import inventoryrows, inventorywrites
from reconciler.store.connections import Connection
from reconciler.store.inventoryrows import ALLOCATIONS, IMAGES, NODES, SKUS, SLOTS, Item, Row, Table, _Work
from schemas import dberrors, progress

_LOCK_KEY = 0x67707561_0001


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row the sync wrote: added, changed, removed (`present = false`) or restored (present again)."""

    kind: str  # sku | image | node | slot | allocation | fleet
    key: str
    action: str  # added | changed | removed | restored

    def render(self) -> str:
        return f"{self.kind} {self.key} {self.action}"


@dataclass(frozen=True, slots=True)
class SyncResult:
    revision: str
    content_hash: str
    new_revision: bool
    changes: tuple[RowChange, ...] = field(default=())
    # Every row was read and compared (no trusted memory): what only a full look finds is looked for.
    full: bool = True

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def counts(self) -> dict[str, int]:
        return dict(Counter(f"{c.kind}.{c.action}" for c in self.changes))


@dataclass
class _TableMemory:
    idents: dict[tuple[Any, ...], tuple[Any, ...]] = field(default_factory=dict)  # docs the row was built from


@dataclass
class Memory:
    """What the last sync of this process wrote or confirmed, so the next one costs what changed.

    Trusted only while `inventory_generation` is the value our own last sync left (no other writer
    since). Every REFRESH_EVERY syncs every row is read and compared again: `refresh_due` says so, and
    the watch loop runs that comparison when no commit is waiting (about 10 s at 10,000 nodes); a sync
    trusts the memory for at most REFRESH_EVERY * STALE_MAX syncs, so a stream of commits with no idle
    moment still gets it. Rows are keyed by the documents (model objects) they were built from: an
    unchanged blob yields the same object, so its rows are neither rebuilt nor compared. Row values are
    not kept (memory follows the documents, not the rows): a sync reads the rows it compares, all of
    them without a delta, only the delta's with one.
    """

    REFRESH_EVERY = 100
    STALE_MAX = 2

    generation: int | None = None
    syncs: int = 0
    compared_at: int = 0  # `syncs` when every row was last compared
    tables: dict[str, _TableMemory] = field(default_factory=dict)
    node_ids: dict[str, Any] = field(default_factory=dict)
    doc_hashes: dict[int, tuple[Any, str]] = field(default_factory=dict)
    doc_hashes_used: dict[int, tuple[Any, str]] = field(default_factory=dict)
    # node name -> (the SlotMap object its slot rows were last built from, node id, their keys)
    slot_maps: dict[str, tuple[Any, Any, tuple[tuple[Any, ...], ...]]] = field(default_factory=dict)
    full_syncs: int = 0
    hashed: weakref.ref[DesiredState] | None = None  # the state content_hash saw last, and its lines per table
    hash_parts: dict[str, bytes] = field(default_factory=dict)
    hash_states: dict[str, tuple[bytes, Any]] = field(default_factory=dict)  # part -> the hasher after it
    synced: weakref.ref[DesiredState] | None = None  # the state the last sync brought the rows to
    slot_count: int = 0  # slot rows of that state
    delta_syncs: int = 0  # syncs that itemised only a delta's documents

    def table(self, name: str) -> _TableMemory:
        return self.tables.setdefault(name, _TableMemory())

    def trusted(self, generation: int) -> bool:
        return self.generation == generation and self.syncs - self.compared_at < self.REFRESH_EVERY * self.STALE_MAX

    def refresh_due(self) -> bool:
        """Time for the periodic comparison of every row (`distrust` it, then sync)."""
        return self.generation is not None and self.syncs - self.compared_at >= self.REFRESH_EVERY

    def distrust(self) -> None:
        """The next sync reads and compares every row."""
        self.generation = None

    def forget(self) -> None:
        self.compared_at = self.syncs
        self.synced = None
        self.tables.clear()
        self.node_ids.clear()
        self.slot_maps.clear()
        self.full_syncs += 1


# Sees the changes so far (SKUs, images, nodes, slots) and the allocations about to be compared (None: all),
# before their rows are written; what it raises rolls the whole sync back.
Guard = Callable[[Sequence[RowChange], set[str] | None], None]


def sync(
    conn: Connection,
    state: DesiredState,
    *,
    memory: Memory | None = None,
    guard: Guard | None = None,
    delta: Delta | None = None,
    shown: progress.Phase | None = None,
    before_commit: Callable[[], object] | None = None,
) -> SyncResult:
    """Project `state` into the inventory tables in one transaction.

    With `memory` (kept by the watch loop across revisions), documents that did not change since its
    last sync are neither turned into rows nor compared; the result is the same as a sync without it.
    `guard` (`Guard`) runs before the allocation rows are written; what it raises rolls the whole sync
    back. `delta`: how the reader built `state` from the state before it, when it did (with `memory`,
    only the documents it names are itemised). `shown` (a progress phase) counts the rows compared.
    `before_commit` runs last inside the transaction; what it raises rolls it back.
    """
    try:
        return _sync(conn, state, memory=memory, guard=guard, read_by=delta, shown=shown, before_commit=before_commit)
    except BaseException:
        if memory is not None:  # what it holds may never have been committed
            memory.generation = None
            memory.forget()
        raise


def _sync(
    conn: Connection,
    state: DesiredState,
    *,
    memory: Memory | None,
    guard: Guard | None,
    read_by: Delta | None,
    shown: progress.Phase | None,
    before_commit: Callable[[], object] | None,
) -> SyncResult:
    digest = inventoryrows.content_hash(state, memory, read_by)
    revision = inventoryrows.revision_key(state, digest)
    changes: list[RowChange] = []
    with dberrors.wrapped("sync inventory"), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        generation = inventorywrites.generation(conn)
        trust = memory is not None and memory.trusted(generation)
        if memory is not None and not trust:
            memory.forget()

        def mem(table: Table) -> _TableMemory | None:
            return memory.table(table.name) if memory is not None else None

        # A state read by delta from the one the trusted memory holds: only changed documents are
        # itemised, and only their rows can have gone (the Fleet is in every node row: all of them).
        delta = delta_since(read_by, memory.synced()) if memory is not None and trust and memory.synced else None
        if delta is not None and "Fleet" in delta.kinds():
            delta = None
        work = _Work(state, delta)
        if (action := inventorywrites.sync_fleet(conn, state, revision)) and state.fleet:
            changes.append(RowChange("fleet", state.fleet.name, action))
        changes += _sync_table(
            conn,
            SKUS,
            [((s.sku,), (s,), partial(inventoryrows.sku_row, s)) for s in work.docs("Sku")],
            revision,
            memory=mem(SKUS),
            shown=shown,
            trust=trust,
            maybe_gone=work.gone("Sku"),
        )
        changes += _sync_table(
            conn,
            IMAGES,
            [((i.slug,), (i,), partial(inventoryrows.image_row, i)) for i in work.docs("Image")],
            revision,
            memory=mem(IMAGES),
            shown=shown,
            trust=trust,
            maybe_gone=work.gone("Image"),
        )
        fleet = state.fleet
        changes += _sync_table(
            conn,
            NODES,
            [
                ((n.name,), (n, state.slot_maps.get(n.name), fleet), partial(inventoryrows.node_row, state, n))
                for n in work.docs("Node", "SlotMap")
            ],
            revision,
            memory=mem(NODES),
            shown=shown,
            trust=trust,
            maybe_gone=work.gone("Node", "SlotMap"),
        )
        node_ids = _node_ids(conn, state, memory, trust, work.names("Node", "SlotMap"))
        if delta is not None and memory is not None:
            slot_items, kept, maybe_gone = _slot_delta(state, node_ids, memory, work.names("Node", "SlotMap"))
        else:
            (slot_items, kept), maybe_gone = inventoryrows.slot_work(state, node_ids, memory if trust else None), None
            if memory is not None:
                memory.slot_count = len(slot_items) + len(kept)
        names: dict[Any, str] = {}  # node id -> name, built only when a slot change is named (not per commit)

        def slot_label(key: tuple[Any, ...]) -> str:
            if not names:
                names.update((v, k) for k, v in node_ids.items())
            return f"{names.get(key[0], key[0])}:{key[1]}"

        slots_written: list[tuple[Any, ...]] = []
        changes += _sync_table(
            conn,
            SLOTS,
            slot_items,
            revision,
            label=slot_label,
            memory=mem(SLOTS),
            shown=shown,
            trust=trust,
            kept=kept,
            maybe_gone=maybe_gone,
            written=slots_written,
        )
        inventorywrites.slot_statuses(conn, slots_written if trust else None)
        if guard is not None:
            guard(changes, work.names("Allocation"))  # the stored allocation rows are still the old ones
        changes += _sync_table(
            conn,
            ALLOCATIONS,
            [((a.id,), (a,), partial(inventoryrows.allocation_row, a)) for a in work.docs("Allocation")],
            revision,
            memory=mem(ALLOCATIONS),
            shown=shown,
            trust=trust,
            maybe_gone=work.gone("Allocation"),
        )
        if changes:
            generation = inventorywrites.bump_generation(conn)
        if memory is not None:
            memory.generation = generation
            memory.syncs += 1
            memory.synced = weakref.ref(state)
            memory.delta_syncs += delta is not None
        new_revision = not conn.execute("SELECT 1 FROM desired_revisions WHERE revision = %s", (revision,)).fetchone()
        if new_revision:
            counts = {
                "nodes": len(state.nodes),
                "slots": memory.slot_count if memory is not None else len(slot_items) + len(kept),
                "skus": len(state.skus),
                "images": len(state.images),
                "allocations": len(state.allocations),
            }
            conn.execute(
                "INSERT INTO desired_revisions (revision, content_hash, file_count, counts)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (revision) DO NOTHING",
                (revision, digest, state.file_count, Jsonb(counts)),
            )
        if before_commit is not None:
            before_commit()  # e.g. the loop's cross-file rules, run meanwhile (reconciler.loop.beside)
    return SyncResult(revision, digest, new_revision, tuple(changes), full=not trust)


def _slot_delta(
    state: DesiredState, node_ids: dict[str, Any], memory: Memory, names: set[str] | None
) -> tuple[list[Item], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Slot rows of changed nodes and slot maps; the keys their last sync wrote may have gone."""
    items: list[Item] = []
    maybe_gone: list[tuple[Any, ...]] = []
    base = memory.synced() if memory.synced is not None else None
    for name in sorted(names or ()):
        last = memory.slot_maps.pop(name, None)
        was = base.slot_maps.get(name) if base is not None else None
        if last is not None:
            maybe_gone.extend(last[2])
            memory.slot_count -= len(last[2])
        elif was is not None and name in node_ids:  # written by an untrusted (full) sync: keys from the base
            maybe_gone.extend((node_ids[name], s.slot_index) for s in was.slots)
            memory.slot_count -= len(was.slots)
        smap, node_id = state.slot_maps.get(name), node_ids.get(name)
        if smap is None or node_id is None:
            continue
        mine = inventoryrows.slot_items(smap, node_id)
        items.extend(mine)
        memory.slot_maps[name] = (smap, node_id, tuple(key for key, _, _ in mine))
        memory.slot_count += len(mine)
    return items, [], maybe_gone


def _node_ids(
    conn: Connection, state: DesiredState, memory: Memory | None, trust: bool, names: set[str] | None = None
) -> dict[str, Any]:
    """name -> node id (ids never change: node rows are never deleted). `names`: only these may be new."""
    wanted = state.slot_maps if names is None else names
    if (
        memory is not None
        and trust
        and all(name in memory.node_ids for name in wanted if name in state.nodes and name in state.slot_maps)
    ):
        return memory.node_ids
    ids = {str(name): node_id for name, node_id in conn.execute("SELECT name, id FROM nodes")}
    if memory is not None:
        memory.node_ids = ids
    return ids


def changed_nodes(changes: Iterable[RowChange]) -> set[str]:
    """Nodes whose host plan inputs changed: the node row or one of its slots (a host plan reads
    nothing else of the inventory but the fleet settings; SKU and image edits reach running VMs
    only through claim snapshots, never by a sync)."""
    out = {c.key for c in changes if c.kind == "node"}
    out |= {c.key.rsplit(":", 1)[0] for c in changes if c.kind == "slot"}
    return out


def added_nodes(changes: Iterable[RowChange]) -> set[str]:
    """Nodes whose row this sync added or made present again (the only ones that can lack a host plan
    after a sync that compared with a trusted memory)."""
    return {c.key for c in changes if c.kind == "node" and c.action in ("added", "restored")}


def _same_docs(a: tuple[Any, ...] | None, b: tuple[Any, ...]) -> bool:
    return a is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _current(
    conn: Connection,
    table: Table,
    memory: _TableMemory | None,
    trust: bool,
    keys: Iterable[tuple[Any, ...]] | None = None,
) -> dict[tuple[Any, ...], tuple[bool, tuple[Any, ...]]]:
    """key -> (present, desired columns) of every row, or of the rows with these keys.

    Read from the table, never kept: at 10,000 nodes the rows' values were
    the largest part of the reconciler's memory, and a delta's rows are a
    few (found by the first key column, an indexed one).
    """
    current = {}
    query = sql.SQL("SELECT {keys}, present, {cols} FROM {name}").format(
        keys=sql.SQL(", ").join(map(sql.Identifier, table.key)),
        cols=sql.SQL(", ").join(map(sql.Identifier, table.columns)),
        name=sql.Identifier(table.name),
    )
    wanted = None if keys is None else set(keys)
    params: tuple[Any, ...] = ()
    if wanted is not None:
        query = sql.SQL("{} WHERE {} = ANY(%s)").format(query, sql.Identifier(table.key[0]))
        params = (sorted({k[0] for k in wanted}, key=str),)
    n = len(table.key)
    for rec in conn.execute(query, params):
        key = tuple(rec[:n])
        if wanted is None or key in wanted:
            current[key] = (bool(rec[n]), tuple(rec[n + 1 :]))
    if memory is not None and not trust:
        memory.idents = {}
    return current


_WRITE_BATCH = 2000  # rows built before they are written: a cold sync's peak memory is one batch's


def _copy_table(
    conn: Connection,
    table: Table,
    items: Sequence[Item],
    revision: str,
    *,
    show: Callable[[tuple[Any, ...]], str],
    memory: _TableMemory | None,
    written: list[tuple[Any, ...]] | None,
    shown: progress.Phase | None,
) -> list[RowChange]:
    """A table with no row yet (a cold sync): one COPY fed as rows are built, so the server stores
    rows while the next are built, and no batch of rows is held."""
    changes: list[RowChange] = []
    idents, wrote = memory.idents if memory is not None else {}, written if written is not None else []
    phase = shown if shown is not None else progress.Phase("copy rows")

    def rows() -> Iterable[Row]:
        for n, (key, docs, build) in enumerate(items, start=1):
            yield build()
            idents[key] = docs
            wrote.append(key)
            changes.append(RowChange(table.kind, show(key), "added"))
            if n % _WRITE_BATCH == 0:
                phase.advance(_WRITE_BATCH)

    inventorywrites.copy_rows(conn, table, rows(), revision=revision)
    phase.advance(len(items) % _WRITE_BATCH)
    return changes


def _sync_table(
    conn: Connection,
    table: Table,
    items: Sequence[Item],
    revision: str,
    *,
    label: Any = None,
    memory: _TableMemory | None = None,
    trust: bool = False,
    kept: Sequence[tuple[Any, ...]] = (),
    maybe_gone: Sequence[tuple[Any, ...]] | None = None,
    written: list[tuple[Any, ...]] | None = None,
    shown: progress.Phase | None = None,
) -> list[RowChange]:
    """Write the differences between the desired rows and the table.

    items: (key, documents the row is built from, row builder). With a
    trusted memory, a row whose documents are the very objects of the last
    sync is known to be in place already (not built, not compared); `kept`
    are keys of such rows the caller did not even itemise (only with `trust`).
    `maybe_gone` (only with `trust`: a delta's items): only these rows may be
    removed, and every row not itemised is in place. `written` collects the keys of
    the rows written (added, changed, restored, removed).
    """
    current = _current(
        conn, table, memory, trust, None if maybe_gone is None else [*(key for key, _, _ in items), *maybe_gone]
    )

    def show(key: tuple[Any, ...]) -> str:
        return str(label(key)) if label else ":".join(str(k) for k in key)

    if not current and maybe_gone is None and not kept and len(items) >= inventorywrites.COPY_FROM:
        return _copy_table(conn, table, items, revision, show=show, memory=memory, written=written, shown=shown)

    inserts: list[Row] = []
    updates: list[Row] = []
    changes: list[RowChange] = []
    wanted: set[tuple[Any, ...]] = set(kept)
    wrote = written if written is not None else []
    shown_at = len(wanted)
    for key, docs, build in items:
        wanted.add(key)
        if memory is not None and trust and _same_docs(memory.idents.get(key), docs):
            continue  # built from the same documents as the row already in place
        row = build()
        if memory is not None:
            memory.idents[key] = docs
        if len(inserts) + len(updates) >= _WRITE_BATCH:  # a cold sync's rows are written as they come
            inventorywrites.write_rows(conn, table, inserts, updates, [], revision=revision)
            inserts, updates = [], []
            if shown is not None:
                shown.advance(len(wanted) - shown_at)
                shown_at = len(wanted)
        if key not in current:  # nothing to compare with
            wrote.append(key)
            inserts.append(row)
            changes.append(RowChange(table.kind, show(key), "added"))
            continue
        values = inventorywrites.compared(table, row)
        present, have = current[key]
        if not present or not inventorywrites.same(have, values):
            wrote.append(key)
            updates.append(row)
            changes.append(RowChange(table.kind, show(key), "changed" if present else "restored"))
    if maybe_gone is None:
        gone = [key for key, (present, _) in current.items() if present and key not in wanted]
    else:
        gone = [key for key in dict.fromkeys(maybe_gone) if key not in wanted and current.get(key, (False,))[0]]
    changes += [RowChange(table.kind, show(key), "removed") for key in sorted(gone, key=str)]
    wrote.extend(gone)
    idents = memory.idents if memory is not None else {}
    for key in gone:
        idents.pop(key, None)

    inventorywrites.write_rows(conn, table, inserts, updates, gone, revision=revision)
    if shown is not None:
        shown.advance(len(wanted) - shown_at)
    return changes
