"""`gpuaas apply [PATH] [--rev REV] [-o text|json]`: reconcile one revision now.

Sync the inventory, absorb host reports, plan, write claims (one transaction
per placement), record releases, write host plans, and print what changed:
placements, pending allocations with their reasons, releases. Applying the
same revision again changes nothing and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from reconciler import sources
from reconciler.commands import db
from reconciler.errors import PermanentError


def register(sub: Any) -> None:
    p = sub.add_parser("apply", help="sync, plan and write claims for a desired-state revision")
    p.add_argument("path", nargs="?", default=Path("."), type=Path)
    p.add_argument("--rev", help="apply the tree at this git revision (default: the working tree)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reconciler.store import connections, migrations, reconciling

    loaded = sources.load(args.path, args.rev)
    if loaded.errors:
        for problem in loaded.errors:
            print(problem.render(), file=sys.stderr)
        raise PermanentError(f"{len(loaded.errors)} validation error(s): nothing applied", code="apply.invalid")
    planner = _planner(args.policy)
    with connections.connect(db.database_url(args), autocommit=True) as conn:
        migrations.migrate(conn)
        result = reconciling.reconcile(conn, loaded.state, source=f"cli {args.path}", planner=planner)
    doc = reconciling.summary(result)
    if args.output == "json":
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(render_text(doc))
    return 0


def _planner(policy: str | None) -> Any:
    from reconciler import planner

    def plan(desired: Any, observed: Any) -> Any:
        return planner.plan(desired, observed, policy=policy)

    return plan


def render_text(doc: dict[str, Any]) -> str:
    out = [f"revision {doc['revision']}"]
    out += _inventory_lines(doc)
    out += _placement_lines(doc)
    out += _release_lines(doc)
    if doc["host_plans"]:
        plans = ", ".join(f"{h['node']}@{h['generation']}" for h in doc["host_plans"])
        out.append(f"host plans written: {plans}")
    if not doc["changed"]:
        out.append("no changes: the store already matches this revision")
    return "\n".join(out)


def _inventory_lines(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    inventory = doc["inventory"]
    if len(inventory) > 12:
        counts = Counter(" ".join(line.split(" ")[::2]) for line in inventory)  # "slot added"
        out.append(f"inventory: {len(inventory)} change(s): "
                   + ", ".join(f"{n} {kind_action}" for kind_action, n in sorted(counts.items())))
    elif inventory:
        out.append(f"inventory: {len(inventory)} change(s)")
        out += [f"  {line}" for line in inventory]
    for f in doc["freed"]:
        where = f"{f['node']}:{f['slot_index']}" if f["slot_index"] is not None else (f["node"] or "")
        out.append(f"cleanup: {f['allocation_id']} {where} {f['outcome']}")
    return out


def _placement_lines(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if doc["placements"]:
        out.append("placed:")
        for p in doc["placements"]:
            slots = ",".join(str(i) for i in p["slot_indexes"]) or "whole node"
            raced = f"  (after {p['conflicts']} lost race(s))" if p["conflicts"] else ""
            out.append(f"  {p['allocation_id']:<24} {p['node']} [{slots}]{raced}")
    if doc["pending"]:
        out.append("pending:")
        for p in doc["pending"]:
            out.append(f"  {p['allocation_id']:<24} {p['code']}: {p['message']}")
    return out


def _release_lines(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    changed_releases = [r for r in doc["releases"] if r["outcome"] in ("releasing", "cancelled")]
    if changed_releases or doc["cancelled"]:
        out.append("released:")
        for r in changed_releases:
            if r["outcome"] == "releasing":
                slots = ",".join(str(i) for i in r["slot_indexes"]) or "whole node"
                out.append(f"  {r['allocation_id']:<24} {r['node']} [{slots}] -> cleanup "
                           "(returned to service only on wipe proof)")
            else:
                out.append(f"  {r['allocation_id']:<24} never placed: released")
        out += [f"  {a:<24} never placed: released" for a in doc["cancelled"]]
    return out
