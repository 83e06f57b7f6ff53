"""The fleet's drift report for operators (text, markdown, json), from the host status rows.

Pure: takes the node documents `reconciler.store.hoststatus.read()` returns
and returns strings. Shared by `gpuaas drift` (the central reconciler) and
the host lab's demo, so it sits below both agents. A drift report was written
by a host, so it is read as untrusted input (`checked`): one malformed report
shows as `drift.report.invalid` for its node and every other node still
shows. Every value is escaped for its output (`schemas.rendering`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from schemas import codes as schemas_codes
from schemas import rendering

INVALID = schemas_codes.DRIFT_REPORT_INVALID
_TEXT_FIELDS = ("allocation_id", "expected", "observed", "heal", "subject", "state")


def _finding_problem(entry: object) -> str | None:
    """Why one drift entry is not a finding (None: it is one)."""
    if not isinstance(entry, Mapping):
        return f"an entry is {type(entry).__name__}, not an object"
    if not isinstance(entry.get("code"), str):
        return "an entry has no string code"
    if not isinstance(entry.get("message"), str):
        return "an entry has no string message"
    idx = entry.get("slot_index")
    if idx is not None and (isinstance(idx, bool) or not isinstance(idx, int)):
        return "an entry has a slot_index that is not an integer"
    if any(entry.get(k) is not None and not isinstance(entry.get(k), str) for k in _TEXT_FIELDS):
        return "an entry has a non-text " + "/".join(_TEXT_FIELDS)
    return None


def check_drift(report: object) -> tuple[list[dict[str, Any]], str | None]:
    """The well-formed findings of one host's drift report, and why the rest was dropped (None: all fine)."""
    if report is None:
        return [], None
    if not isinstance(report, list):
        return [], f"the report is {type(report).__name__}, not a list of findings"
    good: list[dict[str, Any]] = []
    why: str | None = None
    for entry in report:
        problem = _finding_problem(entry)
        if problem is None:
            good.append(dict(entry))
        else:
            why = why or problem
    dropped = len(report) - len(good)
    return good, None if why is None else f"{why} ({dropped} of {len(report)} entries not shown)"


def checked(nodes: Iterable[object]) -> list[dict[str, Any]]:
    """Node documents from `hoststatus.read()`, with every host-written drift report checked.

    A host writes its own row, so a report is untrusted input: a report that
    is not a list of findings, or entries that are not findings, become one
    `drift.report.invalid` finding for that node (with the well-formed
    findings kept), and every other node shows as it is. Idempotent.
    """
    out: list[dict[str, Any]] = []
    for n in nodes:
        doc = dict(n) if isinstance(n, Mapping) else {}
        doc["node"] = str(doc.get("node", "?"))
        findings, why = check_drift(doc.get("drift"))
        if why is not None:
            findings.append(
                {
                    "code": INVALID,
                    "slot_index": None,
                    "heal": None,
                    "message": f"the drift report of {doc['node']} is malformed: {why}",
                }
            )
        doc["drift"] = findings
        out.append(doc)
    return out


def _rows(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in checked(nodes):
        for d in n["drift"]:
            out.append({**d, "node": n["node"]})
    return sorted(out, key=lambda r: (r["node"], r["slot_index"] is None, r["slot_index"] or 0, r["code"]))


def drift_json(nodes: Sequence[Mapping[str, Any]]) -> str:
    doc = {
        "nodes": [
            {
                "node": n["node"],
                "observed_generation": n.get("observed_generation"),
                "plan_generation": n.get("plan_generation"),
                "reported_at": n.get("reported_at"),
                "drift": n["drift"],
            }
            for n in checked(nodes)
        ],
        "total": len(_rows(nodes)),
    }
    return json.dumps(doc, indent=2, default=str)


def drift_text(nodes: Sequence[Mapping[str, Any]]) -> str:
    rows = _rows(nodes)
    if not rows:
        return f"no drift on {len(nodes)} node(s)"
    lines = [f"{len(rows)} drift finding(s) on {len({r['node'] for r in rows})} of {len(nodes)} node(s)"]
    for r in rows:
        slot = "-" if r["slot_index"] is None else r["slot_index"]
        heal = f"  [self-heal: {r['heal']}]" if r.get("heal") else ""
        lines.append(rendering.terminal_text(f"{r['node']} slot {slot}: {r['code']}: {r['message']}{heal}"))
    return "\n".join(lines)


def drift_markdown(nodes: Sequence[Mapping[str, Any]]) -> str:
    rows = _rows(nodes)
    lines = ["# Drift report", ""]
    if not rows:
        lines.append(f"No drift on {len(nodes)} node(s).")
        return "\n".join(lines) + "\n"
    lines += [
        f"{len(rows)} finding(s) on {len({r['node'] for r in rows})} of {len(nodes)} node(s).",
        "",
        "| node | slot | code | finding | expected | observed | self-heal |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            rendering.md_row(
                [
                    r["node"],
                    rendering.Markdown("-") if r["slot_index"] is None else str(r["slot_index"]),
                    rendering.md_code(r["code"]),
                    r["message"],
                    r.get("expected") or "",
                    r.get("observed") or "",
                    r.get("heal") or "report only",
                ]
            )
        )
    return "\n".join(lines) + "\n"


RENDERERS = {"text": drift_text, "markdown": drift_markdown, "json": drift_json}
