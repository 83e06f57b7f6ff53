"""What hosts wrote, read defensively: drift reports and step error reports.

Host reports are input from other machines: a drift report that is not a
list of objects with a string `code` marks that node's report invalid and is
otherwise skipped, so one bad node never breaks a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler.service.readrows import _rows
from reconciler.store.connections import Connection

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
