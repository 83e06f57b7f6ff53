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

from typing import Any

from reconciler.reports import history as history_report
from reconciler.service.allocationreads import allocation, allocations, pending
from reconciler.service.hostreads import (
    _DRIFT_ENTRIES_SQL,
    drift,
    drift_by_code,
    invalid_reports,
    parse_drift,
    step_errors,
)
from reconciler.service.readrows import _SLOT_STATE_SQL, ALLOCATION_STATES, SLOT_STATES, _rows, iso
from reconciler.store.connections import Connection
from schemas import hostreports

# The reads the service's pages and API call, wherever they live (allocationreads, hostreads, readrows).
__all__ = [
    "ALLOCATION_STATES",
    "SLOT_STATES",
    "allocation",
    "allocations",
    "drift",
    "fleet_summary",
    "history",
    "iso",
    "node",
    "nodes",
    "pending",
    "reconciliation_counts",
    "regions",
]

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
