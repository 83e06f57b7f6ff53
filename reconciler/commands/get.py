"""`gpuaas get allocation|node|sku [NAME] [-o text|json|yaml] [--watch]`: kubectl's `get` on the store.

One table row per object (all of a kind, or the one named), read from the
same document `gpuaas status` prints (reconciler.commands.status.collect), so
the two never disagree. Kinds take kubectl's spellings: singular, plural or
short (`alloc`). A name that does not exist is `get.not_found`, with the
closest names offered. `-o json` of one named object is that object; of a
kind, a list.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler import parsing
from reconciler.commands import db, repeating
from schemas import output
from schemas.errors import UsageError

# Each spelling a user may type -> the kind it means.
KINDS = {
    "allocation": "allocation",
    "allocations": "allocation",
    "alloc": "allocation",
    "node": "node",
    "nodes": "node",
    "sku": "sku",
    "skus": "sku",
}


def register(sub: Any) -> None:
    p = sub.add_parser("get", help="list allocations, nodes or SKUs (or one, by name) from the database")
    p.add_argument("kind", choices=tuple(KINDS), help="allocation, node or sku")
    p.add_argument("name", nargs="?", help="one object (default: all of the kind)")
    output.add_argument(p, "text")
    repeating.add_arguments(p)
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def objects(doc: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The objects of `kind` in a status document; SKUs are its capacity rows (one per region x SKU)."""
    if kind == "allocation":
        return list(doc["allocations"])
    if kind == "node":
        return list(doc["nodes"])
    return list(doc["capacity"])


def name_of(kind: str, obj: dict[str, Any]) -> str:
    return str(obj["id"] if kind == "allocation" else obj["sku"] if kind == "sku" else obj["name"])


def select(doc: dict[str, Any], kind: str, name: str | None) -> list[dict[str, Any]]:
    """The objects of `kind` called `name` (all when None); `get.not_found` when there is none."""
    found = objects(doc, kind)
    if name is None:
        return found
    chosen = [o for o in found if name_of(kind, o) == name]
    if not chosen:
        hint = parsing.did_you_mean(parsing.close(name, (name_of(kind, o) for o in found)))
        raise UsageError(
            f"no {kind} {name!r} in the database" + (f"; {hint}" if hint else ""), code=reconciler_codes.GET_NOT_FOUND
        )
    return chosen


def reason(a: dict[str, Any]) -> str:
    """Why an allocation is not (or no longer) running: its failure, else why it waits."""
    c = a.get("lifecycle") or {}
    if c.get("failure"):
        return f"{c['failure']['code']}: {c['failure']['message']}"
    if a.get("pending"):
        return f"{a['pending']['code']}: {a['pending']['message']}"
    return ""


def _rows(kind: str, items: list[dict[str, Any]]) -> list[list[str]]:
    if kind == "allocation":
        head = ["ID", "TENANT", "SKU", "GPUS", "REGION", "STATUS", "NODE", "SLOTS", "REASON"]
        return [head] + [
            [
                a["id"],
                a["tenant"],
                a["sku"],
                str(a["gpu_count"]),
                a["region"],
                a["status"],
                a["node"] or "-",
                ",".join(str(i) for i in a["slot_indexes"]) or "-",
                reason(a) or "-",
            ]
            for a in items
        ]
    if kind == "node":
        head = ["NAME", "REGION", "POOL", "ADMIN", "MODE", "CAPABILITY", "HEALTH", "SLOTS", "ALLOCATIONS"]
        return [head] + [
            [
                n["name"],
                n["region"],
                n["pool"],
                n["admin_state"],
                n["mode"],
                n["capability"],
                "unavailable" if n.get("unavailable") else "healthy" if n["healthy"] else "unhealthy",
                " ".join(f"{k}={v}" for k, v in n["slots"].items()) or "-",
                str(len(n["allocations"])),
            ]
            for n in items
        ]
    head = ["SKU", "REGION", "UNIT", "TOTAL", "IN USE", "FREE", "USABLE", "LAUNCHABLE"]
    return [head] + [
        [
            o["sku"],
            o["region"],
            o["unit"],
            str(o["total"]),
            str(o["in_use"]),
            str(o["free"]),
            str(o["usable"]),
            " ".join(f"{s['gpu_count']}g:{s['launchable']}" for s in o["sizes"]) or "-",
        ]
        for o in items
    ]


def table(rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, the last one left ragged (it may be long)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("   ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in rows)


def render(kind: str) -> Callable[[list[dict[str, Any]]], str]:
    def text(items: list[dict[str, Any]]) -> str:
        return table(_rows(kind, items)) if items else f"No {kind}s in the database."

    return text


def run(args: argparse.Namespace) -> int:
    from reconciler.commands import status

    kind = KINDS[args.kind]
    url = db.reading_url(args)  # a read starts no embedded server (db.not_running says how)

    def read() -> Any:
        chosen = select(status.collect(url), kind, args.name)
        return chosen[0] if args.name is not None and kind != "sku" and output.structured(args.output) else chosen

    def text(value: Any) -> str:
        return render(kind)(value if isinstance(value, list) else [value])

    return repeating.show(args, read, text)
