"""`gpuaas describe allocation|node|sku NAME [-o text|json|yaml]`: one object and what happened to it.

kubectl's `describe`: the object's fields, then what explains its state.
An allocation: its claims, host phase, failure or pending reason, failed
attempts and its events (the lifecycle transitions `gpuaas history
--allocation` reads). A node: liveness (last report), health reasons, slots,
the allocations on it and the recent events of those allocations there. A
SKU: capacity per region with why free units are not launchable, and the
allocations asking for it by status.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from reconciler.commands import db, get
from schemas import output

EVENTS_SHOWN = 20  # a node's events in text; -o json carries them all


def register(sub: Any) -> None:
    p = sub.add_parser("describe", help="one allocation, node or SKU in detail: reasons, claims and events")
    p.add_argument("kind", choices=tuple(get.KINDS), help="allocation, node or sku")
    p.add_argument("name", help="the object's name (allocation id, node name, SKU name)")
    output.add_argument(p, "text")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def collect(url: str, kind: str, name: str) -> dict[str, Any]:
    from reconciler.commands import status
    from reconciler.store import connections, lifecycle

    doc = status.collect(url)
    chosen = get.select(doc, kind, name)
    if kind == "sku":
        allocs = [a for a in doc["allocations"] if a["sku"] == name]
        by_status: dict[str, int] = {}
        for a in allocs:
            by_status[a["status"]] = by_status.get(a["status"], 0) + 1
        return {
            "kind": "sku",
            "name": name,
            "capacity": chosen,
            "allocations": by_status,
            "failed": [
                {"id": a["id"], "tenant": a["tenant"], "reason": get.reason(a)}
                for a in allocs
                if a["status"] in ("failed", "pending")
            ],
        }
    with connections.connect(url, autocommit=True) as conn:
        if kind == "allocation":
            steps = lifecycle.transitions(conn, name) or []
            return {"kind": "allocation", **chosen[0], "events": [t.as_dict() for t in steps]}
        node = chosen[0]
        live = lifecycle.liveness(conn).get(name)
        here = [a for a in doc["allocations"] if a["node"] == name or any(c["node"] == name for c in a["claims"])]
        events = [
            {**t.as_dict(), "allocation": a["id"]}
            for a in here
            for t in lifecycle.transitions(conn, a["id"]) or []
            if t.node in (None, name)
        ]
    events.sort(key=lambda e: e["at"])
    return {
        "kind": "node",
        **node,
        "liveness": None
        if live is None
        else {"state": live.liveness, "reported_at": live.reported_at, "silent_s": live.silent_s, "ttl_s": live.ttl_s},
        "allocations_here": [
            {
                "id": a["id"],
                "tenant": a["tenant"],
                "status": a["status"],
                "slot_indexes": a["slot_indexes"],
                "reason": get.reason(a),
            }
            for a in here
        ],
        "events": events,
    }


def _at(value: Any) -> str:
    return value.astimezone(dt.UTC).isoformat(timespec="seconds") if isinstance(value, dt.datetime) else "-"


def _events(events: list[dict[str, Any]], *, with_allocation: bool = False) -> list[str]:
    if not events:
        return ["Events:     <none>"]
    head = ["AT (UTC)", *(["ALLOCATION"] if with_allocation else []), "EVENT", "STATE", "NODE", "TRY", "DETAIL"]
    rows = [head]
    for e in events:
        d = e["details"]
        detail = []
        if d.get("slot_indexes"):
            detail.append("slots " + ",".join(str(i) for i in d["slot_indexes"]))
        if e["code"]:
            detail.append(f"{e['code']}" + (f" in {d['phase']}" if d.get("phase") else "") + f": {e['message']}")
        if d.get("next"):
            detail.append(f"next {d['next']}" + (", slots quarantined" if d.get("quarantined") else ""))
        rows.append(
            [
                _at(e["at"]),
                *([e["allocation"]] if with_allocation else []),
                e["event"],
                e["state"],
                e["node"] or "-",
                "-" if e["attempt"] is None else str(e["attempt"]),
                "; ".join(detail),
            ]
        )
    return ["Events:", *("  " + line for line in get.table(rows).splitlines())]


def _field(label: str, value: Any) -> str:
    return f"{label + ':':<12}{value}"


def render_allocation(d: dict[str, Any]) -> str:
    c = d.get("lifecycle") or {}
    where = f"{d['node']} slots {','.join(str(i) for i in d['slot_indexes']) or '(whole node)'}" if d["node"] else "-"
    out = [
        _field("Name", d["id"]),
        _field("Tenant", d["tenant"]),
        _field("SKU", f"{d['sku']} x{d['gpu_count']} GPU(s) in {d['region']}"),
        _field("Desired", d["desired_state"]),
        _field("Status", d["status"]),
        _field("Node", where),
        _field("Profile", d["vm_profile"] or "-"),
        _field("Placed", _at(d["placed_at"])),
        _field("Active", _at(d["active_at"])),
    ]
    if c:
        bits = [c["state"]] + ([f"host phase {c['host_phase']}"] if c.get("host_phase") else [])
        if c.get("boot_ip"):
            bits.append(f"ip {c['boot_ip']}")
        if c.get("host_unreachable"):
            bits.append("HOST UNREACHABLE (host silent; nothing is released)")
        out.append(_field("Lifecycle", ", ".join(bits)))
        out.append(_field("Attempts", f"{c.get('failed_attempts', 0)} failed"))
    why = get.reason(d)
    out.append(_field("Reason", why or "-"))
    if d.get("orphaned"):
        out.append(_field("Warning", "no longer declared: set `state: released` to free its claims"))
    if d["claims"]:
        out.append("Claims:")
        rows = [["NODE", "SLOT", "KIND", "STATUS"]] + [
            [c2["node"], str(c2["slot_index"]), c2["kind"], c2["status"]] for c2 in d["claims"]
        ]
        out += ["  " + line for line in get.table(rows).splitlines()]
    else:
        out.append("Claims:     <none>")
    for t in c.get("attempts") or []:
        out.append(
            f"  attempt {t['attempt']} on {t['node']}: {t['outcome']}; {t['code']}"
            + (f" in {t['phase']}" if t.get("phase") else "")
            + f": {t['message']}"
            + (" (slots quarantined)" if t.get("quarantined") else "")
        )
    return "\n".join(out + _events(d["events"]))


def render_node(d: dict[str, Any]) -> str:
    live = d["liveness"] or {}
    seen = (
        f"{live['state']}, last report {_at(live['reported_at'])}"
        + (f" ({live['silent_s']:.0f} s ago, TTL {live['ttl_s']} s)" if live.get("silent_s") is not None else "")
        if live
        else "-"
    )
    out = [
        _field("Name", d["name"]),
        _field("Region", d["region"]),
        _field("Pool", d["pool"]),
        _field("Org", d["org"] or "-"),
        _field("Admin", d["admin_state"] + (" (drained)" if d["drained"] else "")),
        _field("Mode", d["mode"]),
        _field("Capability", d["capability"] + "".join(f"; {r}" for r in d["capability_reasons"])),
        _field("Liveness", seen),
        _field("Slots", " ".join(f"{k}={v}" for k, v in d["slots"].items()) or "-"),
    ]
    reasons = d.get("health_reasons") or []
    out.append("Reasons:" if reasons else "Reasons:    <none> (healthy)")
    out += [f"  {r['code']}: {r['message']}" for r in reasons]
    if d["allocations_here"]:
        out.append("Allocations:")
        rows = [["ID", "TENANT", "STATUS", "SLOTS", "REASON"]] + [
            [a["id"], a["tenant"], a["status"], ",".join(str(i) for i in a["slot_indexes"]) or "-", a["reason"] or "-"]
            for a in d["allocations_here"]
        ]
        out += ["  " + line for line in get.table(rows).splitlines()]
    else:
        out.append("Allocations: <none>")
    return "\n".join(out + _events(d["events"][-EVENTS_SHOWN:], with_allocation=True))


def render_sku(d: dict[str, Any]) -> str:
    out = [_field("Name", d["name"]), "Capacity:"]
    out += ["  " + line for line in get.render("sku")(d["capacity"]).splitlines()]
    for o in d["capacity"]:
        if o["not_launchable"]:
            out.append(
                f"  {o['region']}: not launchable: " + " ".join(f"{k}={v}" for k, v in o["not_launchable"].items())
            )
        for s in o["sizes"]:
            if s["limit"]:
                out.append(f"  {o['region']} {s['gpu_count']} GPU: {s['limit']['code']}: {s['limit']['message']}")
    out.append(_field("Allocations", " ".join(f"{k}={v}" for k, v in sorted(d["allocations"].items())) or "<none>"))
    out += [f"  {a['id']} ({a['tenant']}): {a['reason'] or '-'}" for a in d["failed"]]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    kind = get.KINDS[args.kind]
    doc = collect(db.reading_url(args), kind, args.name)
    if output.structured(args.output):
        output.emit(doc, args.output)
    else:
        print({"allocation": render_allocation, "node": render_node, "sku": render_sku}[kind](doc))
    return 0
