"""`gpuaas slot clear NODE SLOT [-o text|json]`: an operator returns a quarantined slot to service.

A permanent provision failure that implicates the node (a GPU or VF not on
vfio-pci, an image digest mismatch, a disk guard refusal, a readiness
timeout) quarantines the failed allocation's slots with the evidence
(`reconciler.store.lifecycle`). Nothing automatic clears it: this command
(or a commit that changes the slot) does. A slot still waiting for its
cleanup proof stays in cleanup; it becomes available when the proof comes.
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler.commands import db
from schemas import output
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("slot", help="operator actions on one slot (clear a quarantine)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    c = actions.add_parser("clear", help="clear a slot's quarantine (the evidence is printed and kept in the outbox)")
    c.add_argument("node", help="node name")
    c.add_argument("slot", type=int, help="slot index")
    output.add_argument(c, "text")
    db.add_database_arguments(c)
    c.set_defaults(func=run_clear)


def run_clear(args: argparse.Namespace) -> int:
    from reconciler.store import connections, lifecycle

    with connections.connect(db.database_url(args), autocommit=True) as conn:
        cleared = lifecycle.clear_quarantine(conn, args.node, args.slot)
    if cleared.outcome == "unknown":
        raise UsageError(f"no slot {args.slot} on node {args.node}", code="slot.unknown")
    if output.structured(args.output):
        output.emit({"node": cleared.node, "slot_index": cleared.slot_index, "outcome": cleared.outcome,
                     "status": cleared.status, "evidence": cleared.evidence}, args.output)
        return 0
    if cleared.outcome == "not_quarantined":
        print(f"{cleared.node}:{cleared.slot_index} is not quarantined (status {cleared.status})")
        return 0
    ev = cleared.evidence or {}
    print(f"{cleared.node}:{cleared.slot_index} cleared, now {cleared.status}; it was quarantined after "
          f"{ev.get('allocation_id')} attempt {ev.get('attempt')}: {ev.get('code')}: {ev.get('message')}")
    return 0
