"""`gpuaas machine clear NODE [-o text|json|yaml]`: an operator returns a quarantined machine to service.

A failed provider deploy quarantines the node's machine with the provider's
message (`machine_quarantine`, issue 30): the planner places nothing on it.
Nothing automatic clears it: this command does, once the operator repaired it.
"""

from __future__ import annotations

import argparse
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import output
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("machine", help="operator actions on a baremetal machine (clear a quarantine)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    c = actions.add_parser("clear", help="clear a machine's quarantine after a failed deploy (the evidence is printed)")
    c.add_argument("node", help="node name")
    output.add_argument(c, "text")
    db.add_database_arguments(c)
    c.set_defaults(func=run_clear)


def run_clear(args: argparse.Namespace) -> int:
    from reconciler.store import connections, leases

    with connections.connect(db.database_url(args), autocommit=True) as conn:
        cleared = leases.clear_quarantine(conn, args.node)
    if cleared is None:
        raise UsageError(
            f"machine of node {args.node} is not quarantined", code=reconciler_codes.MACHINE_NOT_QUARANTINED
        )
    if output.structured(args.output):
        output.emit({"node": args.node, "outcome": "cleared", **cleared}, args.output)
        return 0
    print(
        f"{args.node} cleared: {cleared['provider']}/{cleared['machine_id']} was quarantined after "
        f"{cleared['allocation_id']}: {cleared['code']}: {cleared['message']}"
    )
    return 0
