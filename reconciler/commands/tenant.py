"""`gpuaas tenant token issue|revoke TENANT --file FILE [-o text|json]`: portal credentials scoped to one tenant.

`serve --tenant-tokens FILE` reads FILE: one `TENANT:SHA256` line per token,
the token's sha256 only, so the file holds no secret. `issue` appends a new
token's line (a tenant may hold several while the portal rotates: issue the
new one, switch, then `revoke` drops all of that tenant's lines; revoke and
issue again to rotate in one step). The token is printed once. A running
`serve` re-reads the file when it changes: no restart.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from schemas import output


def register(sub: Any) -> None:
    p = sub.add_parser("tenant", help="tenant-scoped API tokens for the portal")
    groups = p.add_subparsers(dest="tenant_command", metavar="ACTION")
    groups.required = True
    t = groups.add_parser("token", help="issue or revoke a tenant's API tokens")
    actions = t.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for name, helptext in (
        ("issue", "a new token for the tenant (its other tokens keep working)"),
        ("revoke", "every token of the tenant stops working"),
    ):
        c = actions.add_parser(name, help=helptext)
        c.add_argument("tenant", help="tenant name")
        c.add_argument("--file", type=Path, required=True, help="the serve --tenant-tokens file")
        output.add_argument(c, "text")
        c.set_defaults(func=run, token_action=name)


def run(args: argparse.Namespace) -> int:
    from reconciler.service import tenants

    if args.token_action == "revoke":  # noqa: S105 - an action name
        dropped = tenants.revoke(args.file, args.tenant) if args.file.exists() else 0
        doc: dict[str, Any] = {"tenant": args.tenant, "revoked": dropped}
        if output.structured(args.output):
            output.emit(doc, args.output)
        else:
            print(f"{args.tenant}: {dropped} token(s) revoked")
        return 0
    token = tenants.issue(args.file, args.tenant)
    if output.structured(args.output):
        output.emit({"tenant": args.tenant, "token": token, "file": str(args.file)}, args.output)
    else:
        print(token)
    return 0
