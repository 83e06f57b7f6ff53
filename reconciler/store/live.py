"""Read what the planner cannot learn from git: claims, slot states, host facts.

`observe` returns the planner's `Observed` value; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from policies import hostreports, immutables
from reconciler.plans import Observed, SlotKey
from reconciler.store import observing
from reconciler.store.connections import Connection
from schemas import dberrors

_LIVE = observing.LIVE
Memory = observing.Memory


def observe(conn: Connection, memory: Memory | None = None) -> Observed:
    """What the planner reads from the store. With `memory` (the watch loop), only what changed since
    the memory's last read is read again (`observing`); without, everything."""
    return observing.observe(conn, memory)


# Drift codes of one report (an array of objects, checked by 0008), optionally only the node's own entries.
_CODES = (
    "ARRAY(SELECT DISTINCT e ->> 'code' FROM jsonb_array_elements({col}) e"
    " WHERE jsonb_typeof(e) = 'object' {only} ORDER BY 1)"
)


def host_blocks(
    conn: Connection, nodes: Collection[str] | None = None
) -> tuple[dict[SlotKey, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """Slots their host reports drifted or unschedulable, and nodes it reports corrupt (`policies.hostreports`).

    `nodes`: only these nodes' reports (None: every node's).

    Read from the hosts' last reports (`host_slot_status`, `host_status`), as
    they stand: a slot the host reports clear again is placeable again.
    """
    slot_codes = _CODES.format(col="drift", only="")
    node_codes = _CODES.format(col="drift", only="AND coalesce(jsonb_typeof(e -> 'slot_index'), 'null') = 'null'")
    among = "" if nodes is None else " AND node_name = ANY(%(nodes)s)"
    params = {} if nodes is None else {"nodes": sorted(nodes)}
    with dberrors.wrapped("read host drift reports"):
        # Only reports that say something: a clean fleet reads no JSON.
        slots = conn.execute(
            f"SELECT node_name, slot_index, {slot_codes}, wipe_state = 'failed' FROM host_slot_status"  # noqa: S608
            " WHERE jsonb_typeof(drift) = 'array' AND (drift <> '[]' OR wipe_state = 'failed')" + among,
            params,
        ).fetchall()
        own_rows = conn.execute(
            f"SELECT node_name, {node_codes} FROM host_status WHERE jsonb_typeof(drift) = 'array'"  # noqa: S608
            " AND drift <> '[]'" + among,
            params,
        ).fetchall()
    blocks: dict[SlotKey, tuple[str, ...]] = {}
    for node, idx, codes, wipe_failed in slots:
        found = hostreports.slot_block([str(c) for c in codes or ()], wipe_failed=bool(wipe_failed))
        if found:
            blocks[(str(node), int(idx))] = found
    per_node: dict[str, int] = {}
    for node, _ in blocks:
        per_node[node] = per_node.get(node, 0) + 1
    reported: dict[str, int] = {}
    if per_node:
        with dberrors.wrapped("count reported slots"):
            reported = {
                str(n): int(c)
                for n, c in conn.execute(
                    "SELECT node_name, count(*) FROM host_slot_status WHERE node_name = ANY(%s) GROUP BY node_name",
                    (sorted(per_node),),
                ).fetchall()
            }
    own = {str(n): [str(c) for c in codes or ()] for n, codes in own_rows}
    corrupt: dict[str, tuple[str, ...]] = {}
    for node in sorted(own.keys() | per_node.keys()):
        found = hostreports.node_corruption(own.get(node, ()), per_node.get(node, 0), reported.get(node, 0))
        if found:
            corrupt[node] = found
    return blocks, corrupt


def free_slots(conn: Connection) -> dict[str, list[int]]:
    """Claimable slots per node (available, eligible, on a present active node)."""
    with dberrors.wrapped("read free slots"):
        rows = conn.execute(
            "SELECT n.name, array_agg(s.slot_index ORDER BY s.slot_index)"
            " FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE s.status = 'available' AND s.present AND s.eligible AND n.present"
            " AND n.admin_state = 'active' GROUP BY n.name ORDER BY n.name"
        ).fetchall()
    return {str(name): [int(i) for i in idx] for name, idx in rows}


def held(conn: Connection, *, ids: Iterable[str] | None = None, skus: Iterable[str] = ()) -> dict[str, immutables.Held]:
    """The sale of allocations that hold live claims, as the store placed it (`policies.immutables`).

    `ids` / `skus`: only those allocations, and those of these SKUs (None:
    every one). A failed attempt's retired claims do not count: that
    allocation is pending again and may still be edited. The capacity shape
    is the one it was placed as (its claim kind when the row has none).
    """
    skus = sorted(skus)
    # One query text per shape, not `%(all)s OR ...`: a prepared generic plan for that scans every
    # allocation, and the loop's guard asks about a commit's few allocations on every commit.
    if ids is None:
        among = ""
    elif skus:
        among = " AND (a.id = ANY(%(ids)s) OR a.sku = ANY(%(skus)s))"
    else:
        among = " AND a.id = ANY(%(ids)s)"
    with dberrors.wrapped("read held allocations"):
        rows = conn.execute(
            "SELECT a.id, a.tenant, a.sku, a.region, a.gpu_count, a.image, a.vm_profile,"  # noqa: S608 (constants)
            " coalesce(a.capacity_shape, (SELECT CASE WHEN bool_or(c.claim_kind = 'node_exclusive')"
            "     THEN 'baremetal' ELSE 'gpu_slice' END FROM allocation_resource_claims c"
            "     WHERE c.allocation_id = a.id))"
            " FROM allocations a WHERE EXISTS (SELECT 1 FROM allocation_resource_claims c"
            "     WHERE c.allocation_id = a.id AND c.status = ANY(%(live)s)"
            "     AND NOT EXISTS (SELECT 1 FROM retired_claims rc WHERE rc.claim_id = c.id))"
            + among
            + " ORDER BY a.id",
            {"live": list(_LIVE), "ids": sorted(ids or ()), "skus": skus},
        ).fetchall()
    return {str(r[0]): immutables.Held(str(r[1]), str(r[2]), str(r[3]), int(r[4]), r[5], r[6], r[7]) for r in rows}
