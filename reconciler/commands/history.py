"""`gpuaas history [-n N] [-o text|json]`: the reconciliations recorded in the database, newest first.

Like Flux's status history: revision, what triggered it (a new revision or
a retry, and from which source), when it started, how long it took, its
result (changed, unchanged, error), its counts and its errors.

`gpuaas history --allocation ID`: one allocation's lifecycle instead, oldest
first: requested, each placement (attempt, node, slots), ready, each failed
attempt with its code, phase and reason and what followed (reschedule or
failed, slots quarantined), release, cleanup proven, released, under its
current state. The documents are `reconciler.reports.history`'s, the ones
the service serves; this module renders them as text.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import output
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("history", help="recent reconciliations (revision, result, counts, errors)")
    p.add_argument("-n", type=int, default=20, help="how many (default 20)")
    output.add_argument(p, "text")
    p.add_argument("--allocation", metavar="ID", help="one allocation's state changes and attempts instead")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


_SHOWN = (
    "placed",
    "pending",
    "releasing",
    "slots_freed",
    "inventory_changes",
    "validation_errors",
    "rescheduled",
    "provision_failed",
)


def _message(row: dict[str, Any]) -> str:
    errors = row["errors"] or []
    if errors:
        first = errors[0]
        if isinstance(first, dict):
            text = first.get("text") or f"{first.get('code')}: {first.get('message')}"
        else:
            text = str(first)
        return str(text) + (f" (+{len(errors) - 1} more)" if len(errors) > 1 else "")
    return " ".join(f"{k}={row['counts'][k]}" for k in _SHOWN if row["counts"].get(k))


def render_text(rows: list[dict[str, Any]]) -> str:
    out = [
        f"{'ID':>5}  {'REVISION':<12}  {'RESULT':<9}  {'STARTED (UTC)':<19}  {'TOOK':>7}  {'TRIGGER':<7}  "
        f"{'SOURCE':<30}  MESSAGE"
    ]
    for r in rows:
        started = r["started_at"].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S") if r["started_at"] else "-"
        took = f"{r['seconds']:.2f}s" if r["seconds"] is not None else "-"
        trigger, _, source = r["source"].partition(" ")
        source = source if len(source) <= 30 else "..." + source[-27:]
        out.append(
            f"{r['id']:>5}  {(r['revision'] or '-')[:12]:<12}  {r['result']:<9}  {started:<19}  {took:>7}  "
            f"{trigger or '-':<7}  {source or '-':<30}  {_message(r)}"
        )
    if not rows:
        out.append("  (no reconciliation recorded yet)")
    return "\n".join(out)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def render_allocation(doc: dict[str, Any]) -> str:
    c = doc["lifecycle"]
    head = f"{doc['allocation_id']}  {c['state'].upper()}"
    if c["node"]:
        head += f" on {c['node']}"
    if c["host_phase"]:
        head += f" (host phase {c['host_phase']})"
    if c["failed_attempts"]:
        head += f"; {c['failed_attempts']} failed attempt(s)"
    if c["failure_code"]:
        head += f"; {c['failure_code']}: {c['failure_message']}"
    if c["host_unreachable"]:
        head += "; HOST_UNREACHABLE"
    # Baremetal lease steps (`baremetal.deploying`, ...) are the longest event names.
    lease = any(str(t["event"]).startswith("baremetal.") for t in doc["transitions"])
    wide, state_w = (27, 12) if lease else (17, 9)
    out = [head, f"  {'AT (UTC)':<19}  {'EVENT':<{wide}}  {'STATE':<{state_w}}  {'NODE':<16}  {'TRY':>3}  DETAIL"]
    for t in doc["transitions"]:
        at = t["at"].astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        d = t["details"]
        detail = []
        if d.get("slot_indexes"):
            detail.append("slots " + ",".join(str(i) for i in d["slot_indexes"]))
        if t["code"]:
            detail.append(f"{t['code']}" + (f" in {d['phase']}" if d.get("phase") else "") + f": {t['message']}")
        if d.get("next"):
            detail.append(f"next {d['next']}" + (", slots quarantined" if d.get("quarantined") else ""))
        if d.get("provider"):
            detail.append(
                f"{d['provider']}/{d.get('machine_id')} {d.get('provider_state') or ''}".rstrip()
                + (" (adopted)" if d.get("adopted") else "")
            )
        if t["message"] and not t["code"]:
            detail.append(str(t["message"]))
        out.append(
            f"  {at:<19}  {t['event']:<{wide}}  {t['state']:<{state_w}}  {_cell(t['node']):<16}  "
            f"{_cell(t['attempt']):>3}  {'; '.join(detail)}".rstrip()
        )
    return "\n".join(out)


def run_allocation(args: argparse.Namespace) -> int:
    from reconciler.reports import history
    from reconciler.store import connections

    with connections.connect(db.reading_url(args), autocommit=True) as conn:
        doc = history.allocation(conn, args.allocation)
    if doc is None:
        raise UsageError(
            f"no allocation {args.allocation!r} in the database", code=reconciler_codes.HISTORY_UNKNOWN_ALLOCATION
        )
    if output.structured(args.output):
        output.emit(doc, args.output)
    else:
        print(render_allocation(doc))
    return 0


def run(args: argparse.Namespace) -> int:
    from reconciler.reports import history
    from reconciler.store import connections

    if args.allocation is not None:
        return run_allocation(args)
    with connections.connect(db.reading_url(args), autocommit=True) as conn:
        rows = history.recent(conn, args.n)
    if output.structured(args.output):
        output.emit(rows, args.output)
    else:
        print(render_text(rows))
    return 0
