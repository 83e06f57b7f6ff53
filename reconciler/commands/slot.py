"""`gpuaas slot clear NODE SLOT [-o text|json]`: an operator returns a quarantined slot to service.

`gpuaas slot rewipe NODE SLOT [--reason TEXT] [--by NAME] [-o text|json]`: an
operator asks the node's host agent to run a cleanup-blocked slot's cleanup
again (wipe, verify, the health step, then free), once the cause is fixed
(docs/runbooks/cleanup-blocked-slot.md). The request is audited (a row with
who and why, an outbox event); the agent answers it on its next pass
(`accepted`, or `refused` with the reason). The slot becomes available only
when the new evidence arrives.

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

from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import output
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("slot", help="operator actions on one slot (clear a quarantine, rewipe a blocked slot)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    c = actions.add_parser("clear", help="clear a slot's quarantine (the evidence is printed and kept in the outbox)")
    c.add_argument("node", help="node name")
    c.add_argument("slot", type=int, help="slot index")
    output.add_argument(c, "text")
    db.add_database_arguments(c)
    c.set_defaults(func=run_clear)
    r = actions.add_parser("rewipe", help="ask the host to wipe, verify and health-check a cleanup-blocked slot again")
    r.add_argument("node", help="node name")
    r.add_argument("slot", type=int, help="slot index")
    r.add_argument("--reason", default="", help="why (kept with the request and its outbox event)")
    r.add_argument("--by", default=None, help="who asks (default: the login name)")
    output.add_argument(r, "text")
    db.add_database_arguments(r)
    r.set_defaults(func=run_rewipe)


def run_rewipe(args: argparse.Namespace) -> int:
    import getpass

    from reconciler.store import connections, rewipes

    if args.slot < 0 or len(args.reason) > 500:
        raise UsageError(
            "slot must be >= 0 and --reason at most 500 characters", code=reconciler_codes.SLOT_REWIPE_INVALID
        )
    by = args.by or getpass.getuser()
    with connections.connect(db.database_url(args), autocommit=True) as conn:
        done = rewipes.request(conn, args.node, args.slot, requested_by=by, reason=args.reason)
    if done.outcome == "unknown":
        raise UsageError(f"no slot {args.slot} on node {args.node}", code=reconciler_codes.SLOT_UNKNOWN)
    if output.structured(args.output):
        output.emit(done.as_dict(), args.output)
        return 0
    if done.outcome == "already_pending":
        print(f"{done.node}:{done.slot_index} already has rewipe request {done.request_id} waiting for its host")
        return 0
    print(
        f"{done.node}:{done.slot_index} rewipe requested (request {done.request_id}, slot {done.slot_status}); "
        "the host agent answers on its next pass"
    )
    return 0


def run_clear(args: argparse.Namespace) -> int:
    from reconciler.store import connections, lifecycle

    with connections.connect(db.database_url(args), autocommit=True) as conn:
        cleared = lifecycle.clear_quarantine(conn, args.node, args.slot)
    if cleared.outcome == "unknown":
        raise UsageError(f"no slot {args.slot} on node {args.node}", code=reconciler_codes.SLOT_UNKNOWN)
    if output.structured(args.output):
        output.emit(
            {
                "node": cleared.node,
                "slot_index": cleared.slot_index,
                "outcome": cleared.outcome,
                "status": cleared.status,
                "evidence": cleared.evidence,
            },
            args.output,
        )
        return 0
    if cleared.outcome == "not_quarantined":
        print(f"{cleared.node}:{cleared.slot_index} is not quarantined (status {cleared.status})")
        return 0
    ev = cleared.evidence or {}
    print(
        f"{cleared.node}:{cleared.slot_index} cleared, now {cleared.status}; it was quarantined after "
        f"{ev.get('allocation_id')} attempt {ev.get('attempt')}: {ev.get('code')}: {ev.get('message')}"
    )
    return 0
