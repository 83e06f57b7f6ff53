"""Rendering one host's status for operators (`gpuaas host run` text output).

Pure: takes the document `statuses.HostStatus.as_dict()` produces and returns
a string, every value escaped for a terminal (`schemas.rendering`). The
fleet's drift report, which the central reconciler renders too, is
`schemas.driftreports`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas import rendering


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
    return "\n".join(rendering.terminal_text(line) for line in lines)
