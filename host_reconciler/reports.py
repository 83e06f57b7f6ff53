"""Rendering host status and fleet drift for operators (text, markdown, json).

Pure: takes the documents `statuses.HostStatus.as_dict()` and
`store.read_status()` produce and returns strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def status_text(doc: Mapping[str, Any]) -> str:
    lines = [
        f"node {doc['node']}  generation {doc['generation']} (observed {doc['observed_generation']})"
        f"  mode {doc['mode']}  converged {'yes' if doc['converged'] else 'no'}"
        f"  pass {doc.get('pass_ms', 0):.0f} ms"
    ]
    lines.append(f"  {'slot':>4}  {'state':<16} {'allocation':<14} {'vm':<12} {'wipe':<9} drift")
    for s in doc["slots"]:
        codes = ",".join(d["code"].removeprefix("drift.") for d in s["drift"]) or "-"
        lines.append(
            f"  {s['slot_index']:>4}  {s['state']:<16} {s['allocation_id'] or '-':<14} "
            f"{s['vm_state']:<12} {s['wipe_state'] or '-':<9} {codes}"
        )
    for v in doc["vms"]:
        total = sum(v["phase_timings"].values())
        phase = f" at {v['phase']}" if v["phase"] else ""
        lines.append(f"  vm {v['name']}: {v['state']}{phase}  ({total:.0f} ms in phases)")
        if v.get("error"):
            e = v["error"]
            lines.append(f"     error {e['code']}: {e['message']}")
    for e in doc.get("errors", []):
        lines.append(f"  error {e['allocation_id'] or '-'} {e['step']}: {e['code']}: {e['message']}")
    for p in doc.get("pending", []):
        lines.append(f"  pending {p}")
    return "\n".join(lines)


def _rows(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n in nodes:
        for d in n.get("drift") or []:
            out.append({"node": n["node"], **d})
    return sorted(out, key=lambda r: (r["node"], r["slot_index"] is None, r["slot_index"] or 0, r["code"]))


def drift_json(nodes: Sequence[Mapping[str, Any]]) -> str:
    doc = {
        "nodes": [
            {"node": n["node"], "observed_generation": n.get("observed_generation"),
             "plan_generation": n.get("plan_generation"), "reported_at": n.get("reported_at"),
             "drift": n.get("drift") or []}
            for n in nodes
        ],
        "total": len(_rows(nodes)),
    }  # fmt: skip
    return json.dumps(doc, indent=2, default=str)


def drift_text(nodes: Sequence[Mapping[str, Any]]) -> str:
    rows = _rows(nodes)
    if not rows:
        return f"no drift on {len(nodes)} node(s)"
    lines = [f"{len(rows)} drift finding(s) on {len({r['node'] for r in rows})} of {len(nodes)} node(s)"]
    for r in rows:
        slot = "-" if r["slot_index"] is None else r["slot_index"]
        heal = f"  [self-heal: {r['heal']}]" if r.get("heal") else ""
        lines.append(f"{r['node']} slot {slot}: {r['code']}: {r['message']}{heal}")
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
        cells = [
            r["node"],
            "-" if r["slot_index"] is None else str(r["slot_index"]),
            f"`{r['code']}`",
            r["message"],
            r.get("expected") or "",
            r.get("observed") or "",
            r.get("heal") or "report only",
        ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


RENDERERS = {"text": drift_text, "markdown": drift_markdown, "json": drift_json}
