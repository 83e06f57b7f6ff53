"""The planner's observed state, kept between revisions and refreshed by what changed ([perf2]).

`live.observe(conn)` reads everything (a command, a first run). The watch
loop passes a `Memory`: the first call reads everything too and remembers it
per allocation and per node; later calls read the change log
(`observed_changes`, written by triggers, 0086) since the snapshot of the last
read and re-read only the allocations and nodes it names.

The watermark is the snapshot the change log was read under (xmax and the
transactions still open then): the next read takes every change with
xid >= xmax or in that open list, so a transaction that commits late is never
skipped. Anything that casts doubt reads everything again: no memory yet, a
different database (another database or server, a re-created change log, a
server restart), a change log pruned past the
watermark or a TRUNCATE of a watched table (`observed_horizon`), a server
whose transaction counter is behind the watermark (another cluster, a
restore), and any error during a refresh.

Two reads are not kept: the odd slot statuses (a partial index, 0084, makes
them cost what they return) and the silent hosts (`node_liveness` depends on
the clock, not on a write).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from psycopg import pq

from reconciler.plans import ExistingClaim, Observed, SlotKey
from reconciler.store import leases, lifecycle
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.states import ClaimKind, ClaimStatus, SlotStatus

log = logging.getLogger("gpuaas.observing")

LIVE = ("reserved", "provisioning", "active", "releasing")
PRUNE_EVERY_S = 60.0  # a loop prunes the change log at most this often
KEEP_CHANGES = "30 minutes"  # a reader idle longer than this reads everything again

_ClaimKey = tuple[str, int, int, str, str]  # node, slot present, slot index, allocation id, label: the claims' order


@dataclass
class _Nodes:
    """Per node: what its host reported that the planner reads."""

    hosts: dict[str, tuple[bool | None, bool | None]] = field(default_factory=dict)  # healthy, firmware_ready
    images: dict[str, frozenset[str]] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)  # quarantined machines
    owed: set[str] = field(default_factory=set)  # slice profile debts
    slot_blocks: dict[str, dict[SlotKey, tuple[str, ...]]] = field(default_factory=dict)
    corrupt: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def drop(self, names: Iterable[str]) -> None:
        for n in names:
            self.hosts.pop(n, None)
            self.images.pop(n, None)
            self.blocked.discard(n)
            self.owed.discard(n)
            self.slot_blocks.pop(n, None)
            self.corrupt.pop(n, None)


@dataclass
class _Allocations:
    """Per allocation: its live claims (kept sorted), whether it is placed, where it failed."""

    claims: dict[str, list[_ClaimKey]] = field(default_factory=dict)  # allocation id -> keys in `order`
    order: list[_ClaimKey] = field(default_factory=list)
    claim: dict[_ClaimKey, ExistingClaim] = field(default_factory=dict)
    placed: set[str] = field(default_factory=set)
    avoid: dict[str, frozenset[str]] = field(default_factory=dict)

    def drop(self, ids: Iterable[str]) -> None:
        for a in ids:
            for key in self.claims.pop(a, ()):
                del self.order[bisect.bisect_left(self.order, key)]
                del self.claim[key]
            self.placed.discard(a)
            self.avoid.pop(a, None)


class Memory:
    """The last observed state of one loop, and where in the change log it was read."""

    def __init__(self) -> None:
        self.source: tuple[Any, ...] | None = None  # the database the memory was read from (see _SOURCE)
        self.xmax: int | None = None  # None: nothing trusted, the next observe reads everything
        self.open: list[int] = []  # transactions open at the last read (their changes were not visible)
        self.allocations = _Allocations()
        self.nodes = _Nodes()
        self.last: Observed | None = None  # parts unchanged since are handed on as they are
        self.down: frozenset[str] = frozenset()  # unavailable in `last` but for the silent nodes
        self.pruned_at = -PRUNE_EVERY_S
        self.full_reads = 0
        self.doubt = ""  # why the last full read after the first one was made (logged on gpuaas.observing)
        self.refreshes = 0

    def forget(self) -> None:
        """Doubt: the next observe reads everything."""
        self.xmax = None
        self.source = None
        self.open = []
        self.allocations = _Allocations()
        self.nodes = _Nodes()
        self.last = None
        self.down = frozenset()


def observe(conn: Connection, memory: Memory | None = None) -> Observed:
    if memory is not None and conn.info.transaction_status != pq.TransactionStatus.IDLE:
        # Inside a transaction its own writes are visible and may yet roll back: never kept.
        memory.forget()
        memory = None
    if memory is None:
        return _full(conn, Memory())
    try:
        since = _changes(conn, memory)
        if since is None:
            return _full(conn, memory)
        allocs, nodes, xmax, still_open = since
        got = _refresh(conn, memory, allocs, nodes)
        memory.xmax, memory.open = xmax, still_open
        memory.refreshes += 1
        _prune(conn, memory)
        return got
    except BaseException as e:
        memory.forget()
        memory.doubt = f"a refresh failed: {type(e).__name__}"
        raise


# Which database a memory describes: this database, this change log table (a restore re-creates it),
# this server run (another cluster with the same OIDs started at another time). Any change: read all.
_SOURCE = (
    "ARRAY[(SELECT oid FROM pg_database WHERE datname = current_database())::text,"
    " 'observed_changes'::regclass::oid::text, pg_postmaster_start_time()::text]"
)


def _snapshot(conn: Connection) -> tuple[int, list[int], tuple[Any, ...]]:
    row = conn.execute(
        "SELECT pg_snapshot_xmax(s)::text, ARRAY(SELECT pg_snapshot_xip(s)::text), "  # noqa: S608 (constants)
        + _SOURCE
        + " FROM pg_current_snapshot() s"
    ).fetchone()
    if row is None:
        raise RuntimeError("pg_current_snapshot() returned no row")
    return int(row[0]), [int(x) for x in row[1]], tuple(row[2])


def _changes(conn: Connection, memory: Memory) -> tuple[list[str], list[str], int, list[int]] | None:
    """Allocations and nodes changed since the memory's read, and the new watermark (None: read everything)."""
    if memory.xmax is None or memory.source is None:
        return None
    with dberrors.wrapped("read observed changes"):
        # One statement, one snapshot: the watermark and the changes it covers are read together.
        row = conn.execute(
            "WITH s AS (SELECT pg_current_snapshot() AS snap),"  # noqa: S608 (constants)
            " c AS (SELECT kind, key FROM observed_changes"
            "       WHERE xid >= %(xmax)s::xid8 OR xid = ANY(%(open)s::xid8[]))"
            " SELECT pg_snapshot_xmax(s.snap)::text, ARRAY(SELECT pg_snapshot_xip(s.snap)::text),"
            " pg_snapshot_xmin(s.snap)::text, (SELECT xid::text FROM observed_horizon), " + _SOURCE + ","
            " ARRAY(SELECT DISTINCT key FROM c WHERE kind = 'a' ORDER BY 1),"
            " ARRAY(SELECT DISTINCT key FROM c WHERE kind = 'n' ORDER BY 1)"
            " FROM s",
            {"xmax": str(memory.xmax), "open": [str(x) for x in memory.open]},
        ).fetchone()
    if row is None:
        return None
    xmax, still_open, xmin, horizon = int(row[0]), [int(x) for x in row[1]], int(row[2]), int(row[3])
    oldest = min([memory.xmax, *memory.open])
    doubt = (
        "the change log was pruned or a watched table truncated past the last read"
        if horizon >= oldest
        else "the server's transactions are behind the last read (another cluster, a restore)"
        if xmin < oldest
        else "another database, server or change log"
        if tuple(row[4]) != memory.source
        else ""
    )
    if doubt:
        memory.doubt = doubt
        log.info("observed state read in full: %s", doubt)
        return None
    return [str(a) for a in row[5]], [str(n) for n in row[6]], xmax, still_open


def _full(conn: Connection, memory: Memory) -> Observed:
    memory.forget()
    try:
        # The watermark first: whatever commits while the rows are read is read again next time.
        with dberrors.wrapped("read observed state"):
            xmax, still_open, source = _snapshot(conn)
        got = _refresh(conn, memory, None, None)
    except BaseException:
        memory.forget()
        raise
    memory.source = source
    memory.xmax, memory.open = xmax, still_open
    memory.full_reads += 1
    return got


def _refresh(conn: Connection, memory: Memory, allocs: list[str] | None, nodes: list[str] | None) -> Observed:
    """Re-read these allocations and nodes (None: all of them) into the memory and build the Observed."""
    a, n, last = memory.allocations, memory.nodes, memory.last
    if allocs is None or allocs:
        if allocs is not None:
            a.drop(allocs)
        _read_allocations(conn, a, allocs)
    if nodes is None or nodes:
        if nodes is not None:
            n.drop(nodes)
        _read_nodes(conn, n, nodes)
    with dberrors.wrapped("read observed state"):
        # Slots neither free nor simply claimed (the partial index slots_status_odd, 0084: the
        # predicate must stay the index's, or the read is a scan of every slot again).
        odd = conn.execute(
            "SELECT n.name, s.slot_index, s.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE s.status IN ('releasing', 'cleanup', 'cleanup_blocked', 'failed', 'disabled',"
            " 'quarantined')"
        ).fetchall()
    silent = lifecycle.silent_nodes(conn)
    kept_allocs = last is not None and allocs is not None and not allocs
    kept_nodes = last is not None and nodes is not None and not nodes
    if kept_allocs and last is not None:
        claims, placed, avoid = last.claims, last.placed, last.avoid
    else:
        claims = tuple(a.claim[k] for k in a.order)
        placed, avoid = frozenset(a.placed), MappingProxyType(dict(a.avoid))
    if kept_nodes and last is not None:
        firmware, images = last.firmware_ready, last.image_cache
        slot_blocks, corrupt, down = last.slot_blocks, last.corrupt_nodes, memory.down
    else:
        firmware = MappingProxyType(
            {k: bool(f) for k, (_, f) in n.hosts.items() if f is not None} | dict.fromkeys(n.owed, False)
        )
        images = MappingProxyType(dict(n.images))
        slot_blocks = MappingProxyType({k: v for per in n.slot_blocks.values() for k, v in per.items()})
        corrupt = MappingProxyType(dict(n.corrupt))
        # Unhealthy by their own report, or quarantined; the silent ones are added per read (the clock moves).
        down = memory.down = frozenset(k for k, (healthy, _) in n.hosts.items() if healthy is False) | n.blocked
    got = Observed(
        claims=claims,
        slot_status=MappingProxyType({(str(x), int(i)): SlotStatus(str(s)) for x, i, s in odd}),
        firmware_ready=firmware,
        unavailable_nodes=down | silent if silent else down,
        placed=placed,
        avoid=avoid,
        image_cache=images,
        slot_blocks=slot_blocks,
        corrupt_nodes=corrupt,
    )
    memory.last = got
    return got


def _keyed(sql: str, column: str, keys: Collection[str] | None, joiner: str = " AND ") -> tuple[str, dict[str, Any]]:
    """`sql` limited to rows whose `column` is among `keys` (None: every row). Two query texts, not
    `%(all)s OR ...`: a prepared generic plan for that could not use the key's index."""
    if keys is None:
        return sql.replace("{keyed}", ""), {}
    return sql.replace("{keyed}", f"{joiner}{column} = ANY(%(keys)s)"), {"keys": sorted(keys)}


def _read_allocations(conn: Connection, a: _Allocations, ids: list[str] | None) -> None:
    with dberrors.wrapped("read observed claims"):
        sql, params = _keyed(
            "SELECT c.allocation_id, n.name, c.claim_kind, c.slot_index, c.status, al.tenant,"
            " rc.attempt FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
            " JOIN allocations al ON al.id = c.allocation_id"
            " LEFT JOIN retired_claims rc ON rc.claim_id = c.id"
            " WHERE c.status = ANY(%(live)s){keyed}",
            "c.allocation_id",
            ids,
        )
        claims = conn.execute(sql, {**params, "live": list(LIVE)}).fetchall()
        # A failed attempt's claims do not make the allocation placed: it is pending again.
        sql, params = _keyed(
            "SELECT id FROM allocations WHERE status <> 'pending'{keyed}"  # noqa: S608 (constant text)
            " UNION SELECT DISTINCT c.allocation_id FROM allocation_resource_claims c"
            " WHERE NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id)"
            + ("" if ids is None else " AND c.allocation_id = ANY(%(keys)s)"),
            "id",
            ids,
        )
        placed = conn.execute(sql, params).fetchall()
    a.avoid.update(lifecycle.avoided_nodes(conn, ids))
    a.placed.update(str(r[0]) for r in placed)
    for row in claims:
        aid, node, kind, idx, status, tenant, attempt = str(row[0]), *row[1:]
        label = aid if attempt is None else lifecycle.retired_label(aid, int(attempt))
        key: _ClaimKey = (str(node), 0 if idx is None else 1, -1 if idx is None else int(idx), aid, label)
        a.claim[key] = ExistingClaim(
            allocation_id=label,
            node=str(node),
            kind=ClaimKind(str(kind)),
            slot_index=None if idx is None else int(idx),
            status=ClaimStatus(str(status)),
            tenant=str(tenant),
        )
        a.claims.setdefault(aid, []).append(key)
        if ids is not None:
            bisect.insort(a.order, key)
    if ids is None:
        a.order = sorted(a.claim)


def _read_nodes(conn: Connection, n: _Nodes, names: list[str] | None) -> None:
    from reconciler.store import live  # live reads through this module

    with dberrors.wrapped("read host reports"):
        sql, params = _keyed(
            "SELECT node_name, healthy, firmware_ready FROM host_status{keyed}", "node_name", names, joiner=" WHERE "
        )
        hosts = conn.execute(sql, params).fetchall()
        sql, params = _keyed(
            "SELECT node_name, array_agg(digest_sha256 ORDER BY digest_sha256) FROM node_image_cache{keyed}"
            " GROUP BY node_name",
            "node_name",
            names,
            joiner=" WHERE ",
        )
        cached = conn.execute(sql, params).fetchall()
    n.hosts.update({str(x): (h, f) for x, h, f in hosts})
    n.images.update({str(x): frozenset(str(d) for d in ds) for x, ds in cached})
    n.blocked |= leases.blocked_nodes(conn, names)
    n.owed |= leases.profile_debts(conn, names)
    blocks, corrupt = live.host_blocks(conn, names)
    for key, codes in blocks.items():
        n.slot_blocks.setdefault(key[0], {})[key] = codes
    n.corrupt.update(corrupt)


def _prune(conn: Connection, memory: Memory) -> None:
    """Drop changes older than KEEP_CHANGES; readers behind them read everything (observed_horizon)."""
    now = time.monotonic()
    if now - memory.pruned_at < PRUNE_EVERY_S:
        return
    memory.pruned_at = now
    with dberrors.wrapped("prune observed changes"):
        conn.execute(
            "WITH gone AS (DELETE FROM observed_changes"
            " WHERE at < now() - %s::interval RETURNING xid)"
            " UPDATE observed_horizon SET xid = (SELECT max(xid) FROM gone)"
            " WHERE (SELECT max(xid) FROM gone) > xid",
            (KEEP_CHANGES,),
        )
