"""What the service shows, read straight from the store: allocations, nodes, slots, drift, history.

Every function takes a connection already inside a read-only transaction
(`pool.Pool.reading`) and returns plain JSON-ready data (dicts, lists,
strings, numbers; timestamps as ISO 8601 strings). Nothing here writes.

Slot states on the dashboard and in the API use the store's slot status,
with three refinements an operator needs at a glance: `blocked` is a slot
whose wipe failed (`cleanup_blocked`), `ineligible` is a free slot whose
metadata keeps it out of sale, and `drift` is a slot its host reported
drift on (the underlying status stays in `status`).

Host reports are input from other machines: a drift report that is not a
list of objects with a string `code` marks that node's report invalid
(`drift_valid: false`) and is otherwise skipped, so one bad node never
breaks a page.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from reconciler import codes as reconciler_codes
from reconciler.reports import history as history_report
from reconciler.store import endpoints as store_endpoints
from reconciler.store.connections import Connection
from schemas import dberrors, hostreports

SLOT_STATES = (
    "available",
    "reserved",
    "provisioning",
    "active",
    "leased",
    "releasing",
    "cleanup",
    "blocked",
    "failed",
    "disabled",
    "ineligible",
    "drift",
)
ALLOCATION_STATES = ("pending", "reserved", "provisioning", "active", "releasing", "released", "failed")

# The display state of a slot row `s` (see the module docstring; drift is added in Python or by DRIFT_SLOTS).
# A free slot of a node leased whole (a live node_exclusive claim) is `leased`: never sold as a slot.
_SLOT_STATE_SQL = (
    "CASE WHEN s.status = 'cleanup_blocked' THEN 'blocked'"
    " WHEN s.status = 'available' AND EXISTS (SELECT 1 FROM allocation_resource_claims lc"
    " WHERE lc.node_id = s.node_id AND lc.claim_kind = 'node_exclusive'"
    " AND lc.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN 'leased'"
    " WHEN s.status = 'available' AND NOT s.eligible THEN 'ineligible' ELSE s.status::text END"
)

# Drift entries of every host report that are objects, with the slot index when it is a small integer.
_DRIFT_ENTRIES_SQL = (
    "SELECT h.node_name, e ->> 'code' AS code,"
    " CASE WHEN e ->> 'slot_index' ~ '^[0-9]{1,3}$' THEN (e ->> 'slot_index')::integer END AS slot_index"
    " FROM host_status h CROSS JOIN LATERAL jsonb_array_elements("
    "   CASE WHEN jsonb_typeof(h.drift) = 'array' THEN h.drift ELSE '[]'::jsonb END) e"
    " WHERE jsonb_typeof(e) = 'object' AND jsonb_typeof(e -> 'code') = 'string'"
)
_INVALID_REPORTS_SQL = (
    "SELECT h.node_name FROM host_status h WHERE jsonb_typeof(h.drift) <> 'array' OR EXISTS ("
    " SELECT 1 FROM jsonb_array_elements(h.drift) e"
    " WHERE jsonb_typeof(e) <> 'object' OR jsonb_typeof(e -> 'code') IS DISTINCT FROM 'string')"
)


def iso(value: Any) -> Any:
    """Timestamps as ISO 8601 text; everything else unchanged."""
    return value.isoformat() if isinstance(value, dt.datetime | dt.date) else value


def _rows(conn: Connection, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict[str, Any]]:
    with dberrors.wrapped("read for the service"):
        return conn.cursor(row_factory=dict_row).execute(query, params).fetchall()


# ------------------------------------------------------------------- drift


@dataclass(frozen=True, slots=True)
class DriftReport:
    findings: tuple[dict[str, Any], ...]
    valid: bool  # False: the report was not a list of findings, or some entries were not findings


def parse_drift(value: Any) -> DriftReport:
    """A host's drift report, defensively: keep well-formed findings, flag the rest."""
    if not isinstance(value, list):
        return DriftReport((), value is None)
    out = []
    valid = True
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("code"), str):
            valid = False
            continue
        idx = entry.get("slot_index")
        out.append(
            {
                "code": entry["code"],
                "slot_index": idx if isinstance(idx, int) and not isinstance(idx, bool) else None,
                "message": str(entry.get("message") or ""),
                "allocation_id": _text(entry.get("allocation_id")),
                "expected": _text(entry.get("expected")),
                "observed": _text(entry.get("observed")),
                "heal": _text(entry.get("heal")),
            }
        )
    return DriftReport(tuple(out), valid)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def drift(conn: Connection, *, node: str | None = None) -> dict[str, Any]:
    """Every finding the hosts reported (the same source as `gpuaas drift`), and the invalid reports."""
    where = "WHERE h.node_name = %s" if node else ""
    query = (
        "SELECT h.node_name, h.reported_at, h.observed_generation, p.generation AS plan_generation, h.drift"  # noqa: S608
        f" FROM host_status h LEFT JOIN host_plans p USING (node_name) {where} ORDER BY h.node_name"
    )
    rows = _rows(conn, query, (node,) if node else ())
    findings: list[dict[str, Any]] = []
    invalid: list[str] = []
    for r in rows:
        report = parse_drift(r["drift"])
        if not report.valid:
            invalid.append(r["node_name"])
        findings += [{"node": r["node_name"], **f} for f in report.findings]
    findings.sort(key=lambda f: (f["node"], f["slot_index"] is None, f["slot_index"] or 0, f["code"]))
    return {"nodes_reporting": len(rows), "total": len(findings), "findings": findings, "invalid_reports": invalid}


def drift_by_code(conn: Connection) -> dict[str, int]:
    rows = _rows(conn, f"SELECT code, count(*) AS n FROM ({_DRIFT_ENTRIES_SQL}) d GROUP BY code ORDER BY code")  # noqa: S608 - fixed SQL
    return {r["code"]: int(r["n"]) for r in rows}


def invalid_reports(conn: Connection) -> list[str]:
    return [r["node_name"] for r in _rows(conn, _INVALID_REPORTS_SQL + " ORDER BY h.node_name")]


# ------------------------------------------------------------- allocations

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
    rows = _rows(
        conn,
        f"SELECT {_ALLOCATION_COLUMNS}, count(*) OVER () AS total FROM allocations a"  # noqa: S608
        f" LEFT JOIN nodes n ON n.id = a.node_id{clause}"
        " ORDER BY a.requested_at, a.id LIMIT %s OFFSET %s",
        [*params, limit, offset],
    )
    total = int(rows[0]["total"]) if rows else 0
    if not rows and offset:
        total = int(
            _rows(
                conn,
                f"SELECT count(*) AS n FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id"  # noqa: S608
                f"{clause}",
                params,
            )[0]["n"]
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


# ------------------------------------------------------------------- nodes


def nodes(
    conn: Connection, *, region: str | None = None, state: str | None = None, limit: int = 1000, offset: int = 0
) -> dict[str, Any]:
    """Present nodes with their slots by display state (page by page); `state`: nodes with such a slot.

    A node removed from git that still holds live claims is listed too (`removed`): its tenants run on.
    """
    state_sql = f"CASE WHEN d.node_name IS NOT NULL THEN 'drift' ELSE {_SLOT_STATE_SQL} END"
    rows = _rows(
        conn,
        f"""
        WITH drifted AS (SELECT DISTINCT node_name, slot_index FROM ({_DRIFT_ENTRIES_SQL}) d
                         WHERE slot_index IS NOT NULL),
        picked AS (
            SELECT n.id, n.name, n.region, n.pool, n.admin_state, n.capability, n.org, n.baremetal_sku,
                   n.present, count(*) OVER () AS total
            FROM nodes n
            WHERE (n.present OR EXISTS (SELECT 1 FROM allocation_resource_claims c WHERE c.node_id = n.id
                                        AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')))
              AND (%(region)s::text IS NULL OR n.region = %(region)s)
              AND (%(state)s::text IS NULL OR EXISTS (
                   SELECT 1 FROM node_resource_slots s
                   LEFT JOIN drifted d ON d.node_name = n.name AND d.slot_index = s.slot_index
                   WHERE s.node_id = n.id AND s.present AND {state_sql} = %(state)s))
            ORDER BY n.name LIMIT %(limit)s OFFSET %(offset)s),
        slots AS (
            SELECT p.id, jsonb_agg(jsonb_build_array(s.slot_index, {state_sql}, s.status::text)
                                   ORDER BY s.slot_index) AS slots
            FROM picked p JOIN node_resource_slots s ON s.node_id = p.id AND s.present
            LEFT JOIN drifted d ON d.node_name = p.name AND d.slot_index = s.slot_index
            GROUP BY p.id)
        SELECT p.*, h.healthy, h.reported_at, coalesce(x.slots, '[]') AS slots,
               (SELECT count(DISTINCT c.allocation_id) FROM allocation_resource_claims c
                WHERE c.node_id = p.id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'))
                   AS allocations,
               (SELECT count(*) FROM allocation_resource_claims c WHERE c.node_id = p.id
                  AND c.claim_kind = 'node_exclusive'
                  AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')) AS leases
        FROM picked p LEFT JOIN slots x ON x.id = p.id LEFT JOIN host_status h ON h.node_name = p.name
        ORDER BY p.name""",  # noqa: S608 - fixed fragments
        {"region": region, "state": state, "limit": limit, "offset": offset},
    )
    total = int(rows[0]["total"]) if rows else 0
    items = []
    for r in rows:
        slots = [{"slot_index": i, "state": st, "status": status} for i, st, status in r["slots"]]
        by_state: dict[str, int] = {}
        for s in slots:
            by_state[s["state"]] = by_state.get(s["state"], 0) + 1
        items.append(
            {
                "name": r["name"],
                "region": r["region"],
                "pool": r["pool"],
                "admin_state": r["admin_state"],
                "capability": r["capability"],
                "org": r["org"],
                "baremetal_sku": r["baremetal_sku"],
                "healthy": r["healthy"],
                "reported_at": iso(r["reported_at"]),
                "leased": bool(r["leases"]),
                "allocations": int(r["allocations"]),
                "slots_by_state": by_state,
                "slots": slots,
                "removed": not r["present"],
            }
        )
    return {"total": total, "offset": offset, "limit": limit, "items": items}


def node(conn: Connection, name: str) -> dict[str, Any] | None:
    """One node: its slots (state, devices, claim, host view, drift), its host report, its allocations."""
    rows = _rows(
        conn,
        "SELECT n.name, n.region, n.pool, n.admin_state, n.capability, n.capability_reasons, n.org,"
        " n.baremetal_sku, n.present, n.hardware_tags, n.profile_tags, n.revision,"
        " h.healthy, h.reported_at, h.observed_generation, h.drift, h.errors, h.details,"
        " h.firmware_ready, p.generation AS plan_generation"
        " FROM nodes n LEFT JOIN host_status h ON h.node_name = n.name"
        " LEFT JOIN host_plans p ON p.node_name = n.name WHERE n.name = %s",
        (name,),
    )
    if not rows:
        return None
    r = rows[0]
    report = parse_drift(r["drift"])
    slot_rows = _rows(
        conn,
        f"""
        SELECT s.slot_index, s.status::text AS status, {_SLOT_STATE_SQL} AS state, s.gpu_pci_address, s.gpu_model,
               s.numa_node, s.slot_group, s.nvme_device, s.network_fabric, s.fabric_vf_pci_address, s.mac_address,
               host(s.private_ip) AS private_ip, s.eligible, s.ineligible_reasons, s.approved, s.enabled,
               s.status_changed_at, c.allocation_id, c.status::text AS claim_status, a.tenant,
               hs.vm_state, hs.wipe_state, hs.wipe_error, hs.updated_at AS host_updated_at
        FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id
        LEFT JOIN allocation_resource_claims c ON c.node_id = s.node_id
             AND (c.slot_index = s.slot_index OR c.claim_kind = 'node_exclusive')
             AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')
        LEFT JOIN allocations a ON a.id = c.allocation_id
        LEFT JOIN host_slot_status hs ON hs.node_name = n.name AND hs.slot_index = s.slot_index
        WHERE n.name = %s AND s.present ORDER BY s.slot_index""",  # noqa: S608 - fixed fragments
        (name,),
    )
    slot_drift: dict[int, list[dict[str, Any]]] = {}
    for f in report.findings:
        if f["slot_index"] is not None:
            slot_drift.setdefault(f["slot_index"], []).append(f)
    slots = []
    for s in slot_rows:
        found = slot_drift.get(s["slot_index"], [])
        slots.append(
            {
                "slot_index": s["slot_index"],
                "state": "drift" if found else s["state"],
                "status": s["status"],
                "gpu_pci_address": s["gpu_pci_address"],
                "gpu_model": s["gpu_model"],
                "numa_node": s["numa_node"],
                "slot_group": s["slot_group"],
                "nvme_device": s["nvme_device"],
                "network_fabric": s["network_fabric"],
                "fabric_vf_pci_address": s["fabric_vf_pci_address"],
                "mac_address": s["mac_address"],
                "private_ip": s["private_ip"],
                "eligible": s["eligible"],
                "ineligible_reasons": list(s["ineligible_reasons"] or ()),
                "approved": s["approved"],
                "enabled": s["enabled"],
                "state_changed_at": iso(s["status_changed_at"]),
                "claim": {"allocation_id": s["allocation_id"], "status": s["claim_status"], "tenant": s["tenant"]}
                if s["allocation_id"]
                else None,
                "host": {
                    "vm_state": s["vm_state"],
                    "wipe_state": s["wipe_state"],
                    "wipe_error": s["wipe_error"],
                    "updated_at": iso(s["host_updated_at"]),
                }
                if s["vm_state"] is not None
                else None,
                "drift": found,
            }
        )
    errs, errors_valid = step_errors(r["errors"])
    return {
        "name": r["name"],
        "region": r["region"],
        "pool": r["pool"],
        "admin_state": r["admin_state"],
        "present": r["present"],
        "capability": r["capability"],
        "capability_reasons": list(r["capability_reasons"] or ()),
        "org": r["org"],
        "baremetal_sku": r["baremetal_sku"],
        "hardware_tags": list(r["hardware_tags"] or ()),
        "profile_tags": list(r["profile_tags"] or ()),
        "revision": r["revision"],
        "host": {
            "healthy": r["healthy"],
            "reported_at": iso(r["reported_at"]),
            "observed_generation": r["observed_generation"],
            "plan_generation": r["plan_generation"],
            "drift_valid": report.valid,
            "errors_valid": errors_valid,
            "errors": errs,
            **_onboarding(r["details"], r["firmware_ready"]),
        }
        if r["reported_at"] is not None
        else None,
        "drift": list(report.findings),
        "slots": slots,
        "allocations": allocations(conn, node=name, limit=100)["items"],
    }


def _onboarding(details: Any, firmware_ready: bool | None) -> dict[str, Any]:
    """The host's own report (agent version, bootstrap, reboot need, firmware evidence); nulls when none."""
    rep = hostreports.from_dict(details.get("host") if isinstance(details, dict) else None)
    if rep is None:
        return {
            "agent_version": None,
            "reboot_required": None,
            "reboot_reasons": [],
            "bootstrap_state": None,
            "bootstrap_checked_at": None,
            "firmware": {"ready": firmware_ready, "code": None, "evidence": {}},
        }
    return {
        "agent_version": rep.agent_version,
        "reboot_required": rep.reboot_required,
        "reboot_reasons": list(rep.reboot_reasons),
        "bootstrap_state": rep.bootstrap_state,
        "bootstrap_checked_at": rep.bootstrap_checked_at,
        "firmware": {"ready": firmware_ready, "code": rep.firmware_code, "evidence": dict(rep.firmware_evidence)},
    }


# ----------------------------------------------------------------- summary


def fleet_summary(conn: Connection, *, overview: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Counts for the dashboard's header and for /metrics: one round of aggregate queries.

    `overview`: `regions(conn)` read in the same transaction; its slot counts are summed instead of
    scanning every slot a second time (the dashboard reads both: 80,000 slots at 10,000 nodes).
    """
    nodes_by = _rows(conn, "SELECT admin_state, count(*) AS n FROM nodes WHERE present GROUP BY admin_state")
    unhealthy = _rows(
        conn,
        "SELECT count(*) AS n FROM host_status h JOIN nodes n ON n.name = h.node_name"
        " WHERE n.present AND h.healthy IS FALSE",
    )[0]["n"]
    if overview is not None:
        summed: dict[str, int] = {}
        for entry in overview:
            for st, n in entry["slots"].items():
                summed[st] = summed.get(st, 0) + n
        slots_by: list[dict[str, Any]] = [{"state": st, "n": n} for st, n in summed.items()]
    else:
        slots_by = _rows(
            conn,
            f"SELECT {_SLOT_STATE_SQL} AS state, count(*) AS n FROM node_resource_slots s"  # noqa: S608
            " JOIN nodes n ON n.id = s.node_id WHERE s.present AND n.present GROUP BY 1",
        )
    allocs_by = _rows(
        conn, "SELECT status, count(*) AS n FROM allocations WHERE present OR status <> 'pending' GROUP BY status"
    )
    pending_by = _rows(
        conn,
        "SELECT coalesce(pending_code, 'none') AS code, count(*) AS n FROM allocations"
        " WHERE status = 'pending' AND present AND desired_state = 'present' GROUP BY 1",
    )
    drifted = _rows(
        conn,
        f"SELECT count(DISTINCT (node_name, slot_index)) AS n FROM ({_DRIFT_ENTRIES_SQL}) d"  # noqa: S608
        " WHERE slot_index IS NOT NULL",
    )[0]["n"]
    return {
        "nodes": {r["admin_state"]: int(r["n"]) for r in nodes_by},
        "nodes_total": sum(int(r["n"]) for r in nodes_by),
        "nodes_unhealthy": int(unhealthy),
        "slots": {
            r["state"]: int(r["n"])
            for r in sorted(slots_by, key=lambda r: SLOT_STATES.index(r["state"]) if r["state"] in SLOT_STATES else 99)
        },
        "slots_total": sum(int(r["n"]) for r in slots_by),
        "slots_with_drift": int(drifted),
        "allocations": {r["status"]: int(r["n"]) for r in allocs_by},
        "pending_by_reason": {r["code"]: int(r["n"]) for r in pending_by},
        "drift_by_code": drift_by_code(conn),
        "invalid_drift_reports": invalid_reports(conn),
    }


def regions(conn: Connection) -> list[dict[str, Any]]:
    """Per region x pool: nodes and slots by display state (the grid's overview at any fleet size)."""
    counts = _rows(conn, "SELECT region, pool, count(*) AS n FROM nodes WHERE present GROUP BY 1, 2 ORDER BY 1, 2")
    slots = _rows(
        conn,
        f"SELECT n.region, n.pool, {_SLOT_STATE_SQL} AS state, count(*) AS n"  # noqa: S608
        " FROM nodes n JOIN node_resource_slots s ON s.node_id = n.id AND s.present"
        " WHERE n.present GROUP BY 1, 2, 3",
    )
    out = {
        (r["region"], r["pool"]): {
            "region": r["region"],
            "pool": r["pool"],
            "nodes": int(r["n"]),
            "slots_total": 0,
            "slots": {},
        }
        for r in counts
    }
    for r in slots:
        entry = out[(r["region"], r["pool"])]
        entry["slots"][r["state"]] = int(r["n"])
        entry["slots_total"] += int(r["n"])
    return list(out.values())


def history(conn: Connection, limit: int = 20) -> list[dict[str, Any]]:
    """The newest reconciliations, as `gpuaas history -o json` shows them."""
    rows = history_report.recent(conn, limit)
    return [{k: iso(v) for k, v in row.items()} for row in rows]


def reconciliation_counts(conn: Connection) -> tuple[dict[str, int], list[tuple[float, int]], float]:
    """Reconciliations by result; finished durations as (upper bound, cumulative count) buckets and their sum."""
    by_result = _rows(conn, "SELECT result, count(*) AS n FROM reconciliation_history GROUP BY result")
    bounds = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
    cols = ", ".join(f"count(*) FILTER (WHERE d <= {b}) AS b{i}" for i, b in enumerate(bounds))
    row = _rows(
        conn,
        f"SELECT {cols}, count(*) AS n, coalesce(sum(d), 0) AS total FROM ("  # noqa: S608
        " SELECT extract(epoch FROM finished_at - started_at)::float8 AS d FROM reconciliations"
        " WHERE finished_at IS NOT NULL AND result IN ('changed', 'unchanged', 'error')) x",
    )[0]
    buckets = [(b, int(row[f"b{i}"])) for i, b in enumerate(bounds)] + [(float("inf"), int(row["n"]))]
    return {r["result"]: int(r["n"]) for r in by_result}, buckets, float(row["total"])


_STEP_ERROR_TEXT = ("code", "message", "step")  # strings every entry of a host's error report carries


def step_errors(raw: Any) -> tuple[list[dict[str, Any]], bool]:
    """A host's error report as entries a page can show, and whether it was whole.

    The database refuses a malformed report (0055), but a row written before,
    or by the table owner, is not trusted either: an entry of the wrong shape
    is shown as `host.report.invalid` instead of failing the page.
    """
    if not isinstance(raw, list):
        return [_invalid_entry("the error report is not a list")], False
    out, whole = [], True
    for e in raw:
        if not _missing(e):
            out.append(
                {"code": e["code"], "message": e["message"], "step": e["step"], "allocation_id": e["allocation_id"]}
            )
        else:
            whole = False
            out.append(_invalid_entry(f"an entry lacks {', '.join(_missing(e))}: {str(e)[:200]}"))
    return out, whole


def _missing(e: Any) -> list[str]:
    if not isinstance(e, dict):
        return ["an object"]
    bad = [k for k in _STEP_ERROR_TEXT if not isinstance(e.get(k), str) or (k == "code" and not e[k])]
    if "allocation_id" not in e or not (e["allocation_id"] is None or isinstance(e["allocation_id"], str)):
        bad.append("allocation_id")
    return bad


def _invalid_entry(message: str) -> dict[str, Any]:
    return {
        "code": reconciler_codes.HOST_REPORT_INVALID,
        "message": f"invalid host error report: {message}",
        "step": None,
        "allocation_id": None,
    }
