"""Allocations as the service shows them: the list, one in full, the pending queue.

One allocation in full: its claims, the host's view, its lifecycle, its
bare-metal lease and the endpoints a tenant reaches it by.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.service.readrows import _rows, iso
from reconciler.store import endpoints as store_endpoints
from reconciler.store.connections import Connection

_ALLOCATION_COLUMNS = (
    "a.id, a.tenant, a.sku, a.gpu_count, a.region, a.image, a.vm_profile, a.desired_state, a.status, a.present,"
    " a.capacity_shape, n.name AS node, a.placement, a.pending_code, a.pending_message, a.pending_since,"
    " a.requested_at, a.placed_at, a.placed_revision, a.active_at, a.release_requested_at, a.released_at,"
    " a.status_changed_at, a.updated_at"
)


def _allocation_summary(r: Mapping[str, Any]) -> dict[str, Any]:
    placement: dict[str, Any] = r["placement"] if isinstance(r["placement"], dict) else {}
    profile = placement.get("profile")
    profile = profile.get("name") if isinstance(profile, dict) else profile
    return {
        "id": r["id"],
        "tenant": r["tenant"],
        "state": r["status"],
        "desired_state": r["desired_state"],
        "present": r["present"],
        "region": r["region"],
        "sku": r["sku"],
        "gpu_count": r["gpu_count"],
        "capacity_shape": r["capacity_shape"],
        "node": r["node"],
        "slot_indexes": [int(i) for i in placement.get("slot_indexes") or ()],
        "vm_profile": profile or r["vm_profile"],
        "image": r["image"],
        "pending": {"code": r["pending_code"], "message": r["pending_message"], "since": iso(r["pending_since"])}
        if r["pending_code"]
        else None,
        "requested_at": iso(r["requested_at"]),
        "placed_at": iso(r["placed_at"]),
        "active_at": iso(r["active_at"]),
        "release_requested_at": iso(r["release_requested_at"]),
        "released_at": iso(r["released_at"]),
        "state_changed_at": iso(r["status_changed_at"]),
        "updated_at": iso(r["updated_at"]),
    }


def allocations(
    conn: Connection,
    *,
    tenant: str | None = None,
    state: str | None = None,
    node: str | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> dict[str, Any]:
    """Allocations, oldest request first, filtered by tenant, state (status) and node."""
    where, params = [], []
    for column, value in (("a.tenant", tenant), ("a.status", state), ("n.name", node)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    clause = (" WHERE " + " AND ".join(where)) if where else ""
    # The page, then the count apart: `count(*) OVER ()` made every matching row (20,000 at the bench's
    # fleet) go through the join and the select list for a page of 50 (migration 0090's indexes serve both).
    rows = _rows(
        conn,
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations a"  # noqa: S608
        f" LEFT JOIN nodes n ON n.id = a.node_id{clause}"
        " ORDER BY a.requested_at, a.id LIMIT %s OFFSET %s",
        [*params, limit, offset],
    )
    if offset == 0 and len(rows) < limit:
        total = len(rows)  # the whole answer is on this page
    else:
        join = " LEFT JOIN nodes n ON n.id = a.node_id" if node is not None else ""
        total = int(
            _rows(conn, f"SELECT count(*) AS n FROM allocations a{join}{clause}", params)[0]["n"]  # noqa: S608
        )
    return {"total": total, "offset": offset, "limit": limit, "items": [_allocation_summary(r) for r in rows]}


def allocation(conn: Connection, allocation_id: str) -> dict[str, Any] | None:
    """One allocation: state and why, where it runs, the boot slot's MAC and IP, the host's view, its claims."""
    rows = _rows(
        conn,
        f"SELECT {_ALLOCATION_COLUMNS}, a.pending_details FROM allocations a"  # noqa: S608
        " LEFT JOIN nodes n ON n.id = a.node_id WHERE a.id = %s",
        (allocation_id,),
    )
    if not rows:
        return None
    r = rows[0]
    doc = _allocation_summary(r)
    if doc["pending"] is not None:
        doc["pending"]["details"] = r["pending_details"]
    claims = _rows(
        conn,
        "SELECT n.name AS node, c.slot_index, c.claim_kind, c.status, c.created_at, c.active_at,"
        " c.release_requested_at, c.released_at, c.failed_at, c.resource_snapshot -> 'slot' AS slot,"
        " c.resource_snapshot -> 'image' ->> 'slug' AS image"
        " FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
        " WHERE c.allocation_id = %s ORDER BY c.created_at, c.slot_index NULLS FIRST",
        (allocation_id,),
    )
    live = [
        c
        for c in claims
        if c["status"] not in ("released", "failed") and (doc["node"] is None or c["node"] == doc["node"])
    ] or claims  # not a failed attempt's
    boot = next(
        (
            c["slot"]
            for c in sorted(live, key=lambda c: c["slot_index"] if c["slot_index"] is not None else -1)
            if isinstance(c["slot"], dict)
        ),
        None,
    )
    doc["boot_slot"] = (
        {
            "slot_index": boot.get("slot_index"),
            "mac_address": boot.get("mac_address"),
            "private_ip": boot.get("private_ip"),
        }
        if boot
        else None
    )
    doc["claims"] = [
        {
            "node": c["node"],
            "slot_index": c["slot_index"],
            "kind": c["claim_kind"],
            "status": c["status"],
            "created_at": iso(c["created_at"]),
            "active_at": iso(c["active_at"]),
            "release_requested_at": iso(c["release_requested_at"]),
            "released_at": iso(c["released_at"]),
            "failed_at": iso(c["failed_at"]),
        }
        for c in claims
    ]
    doc["host"] = _host_view(conn, allocation_id, doc["node"])
    doc["lifecycle"] = _lifecycle(conn, allocation_id)
    doc["baremetal"] = _baremetal(conn, allocation_id)
    # How the tenant gets in: public address:port -> the VM's private address (SSH first), on its current node.
    found = store_endpoints.current(conn, [allocation_id]).get(allocation_id, [])
    doc["endpoints"] = [e.as_dict() for e in found]
    ssh = next((e for e in found if e.ssh), None)
    doc["ssh"] = {"address": ssh.public_address, "port": ssh.public_port} if ssh else None
    lease = doc["baremetal"]
    if doc["ssh"] is None and lease is not None and lease["phase"] == "active" and lease["ssh_endpoint"]:
        host, _, port = str(lease["ssh_endpoint"]).rpartition(":")  # a leased machine is reached directly
        doc["ssh"] = {"address": host.strip("[]"), "port": int(port)}
    return doc


def _baremetal(conn: Connection, allocation_id: str) -> dict[str, Any] | None:
    """The lease through its machine provider: phase, provider, machine, timings, SSH endpoint."""
    from reconciler.store import leases

    lease = leases.details(conn, [allocation_id]).get(allocation_id)
    if lease is None:
        return None
    return {k: iso(v) for k, v in lease.items() if k != "allocation_id"}


def _lifecycle(conn: Connection, allocation_id: str) -> dict[str, Any] | None:
    """The allocation's lifecycle (reconciler.store.lifecycle): state, host phase, boot IP, attempts, failure."""
    from reconciler.store import lifecycle

    c = lifecycle.lifecycles(conn, [allocation_id]).get(allocation_id)
    if c is None:
        return None
    return {
        "state": c["state"],
        "host_phase": c["host_phase"],
        "host_vm_state": c["host_vm_state"],
        "boot_ip": c["boot_ip"],
        "host_unreachable": bool(c["host_unreachable"]),
        "host_reported_at": iso(c["host_reported_at"]),
        "failed_attempts": int(c["failed_attempts"]),
        "failure": {"code": c["failure_code"], "message": c["failure_message"], "at": iso(c["failed_at"])}
        if c["failure_code"]
        else None,
        "attempts": [
            {
                "attempt": t["attempt"],
                "node": t["node"],
                "slot_indexes": list(t["slot_indexes"] or ()),
                "phase": t["phase"],
                "code": t["code"],
                "message": t["message"],
                "outcome": t["outcome"],
                "quarantined": t["quarantined"],
                "failed_at": iso(t["failed_at"]),
            }
            for t in c["attempts"]
        ],
    }


def _host_view(conn: Connection, allocation_id: str, node: str | None) -> dict[str, Any] | None:
    """What the node's host reconciler last reported about this allocation (None: no report yet)."""
    if node is None:
        return None
    rows = _rows(
        conn,
        "SELECT reported_at, details, errors, lease_allocation_id, lease_state FROM host_status WHERE node_name = %s",
        (node,),
    )
    if not rows:
        return None
    r = rows[0]
    details: dict[str, Any] = r["details"] if isinstance(r["details"], dict) else {}
    vms: list[Any] = details["vms"] if isinstance(details.get("vms"), list) else []
    vm = next((v for v in vms if isinstance(v, dict) and v.get("allocation_id") == allocation_id), None)
    errs = r["errors"] if isinstance(r["errors"], list) else []
    slots = _rows(
        conn,
        "SELECT slot_index, vm_state, vm_ready_at FROM host_slot_status"
        " WHERE node_name = %s AND allocation_id = %s ORDER BY slot_index",
        (node, allocation_id),
    )
    lease = r["lease_state"] if r["lease_allocation_id"] == allocation_id else None
    return {
        "reported_at": iso(r["reported_at"]),
        "vm_state": vm.get("state") if vm else (slots[0]["vm_state"] if slots else lease),
        "phase": vm.get("phase") if vm else None,
        "vm_ready_at": iso(slots[0]["vm_ready_at"]) if slots else None,
        "error": vm.get("error") if vm else None,
        "errors": [e for e in errs if isinstance(e, dict) and e.get("allocation_id") == allocation_id],
    }


def pending(conn: Connection, limit: int = 200) -> list[dict[str, Any]]:
    rows = _rows(
        conn,
        f"SELECT {_ALLOCATION_COLUMNS} FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id"  # noqa: S608
        " WHERE a.status = 'pending' AND a.present AND a.desired_state = 'present'"
        " ORDER BY a.requested_at, a.id LIMIT %s",
        (limit,),
    )
    return [_allocation_summary(r) for r in rows]
