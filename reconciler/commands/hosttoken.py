"""`gpuaas host token issue|rotate|revoke NODE [--out FILE] [-o text|json]`: a node's credential for the agent API.

The host agent talks to `gpuaas serve` with this token (`gpuaas host run
--service URL --credential FILE`); the service knows the node from it, and
the node may then read only its own plan and write only its own reports.
Only the token's sha256 is stored (node_agent_tokens, migration 0060).
`issue` refuses a node that has one (so a token in use is never replaced
by mistake); `rotate` replaces it, and every `serve` replica refuses the old
one at once (a NOTIFY drops their caches). The token is printed once, or
written to --out (mode 0600, never over an existing file).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import output
from schemas.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("token", help="issue, rotate or revoke a node's agent API credential")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    for name, helptext in (
        ("issue", "a first token for a node (refused when it has one)"),
        ("rotate", "a new token for a node; the old one stops working at once"),
        ("revoke", "the node's token stops working; no new one"),
    ):
        c = actions.add_parser(name, help=helptext)
        c.add_argument("node", help="node name")
        if name != "revoke":
            c.add_argument("--out", type=Path, help="write the token to this new file (mode 0600), not stdout")
        output.add_argument(c, "text")
        db.add_database_arguments(c)
        c.set_defaults(func=run, token_action=name)


def _write_new(path: Path, token: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise UsageError(
            f"--out {path} exists: the token is written only to a new file", code=reconciler_codes.HOST_TOKEN_OUT_EXISTS
        ) from None
    except OSError as e:
        raise UsageError(
            f"cannot create --out {path}: {e.strerror or e}", code=reconciler_codes.HOST_TOKEN_OUT_UNWRITABLE
        ) from e
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def run(args: argparse.Namespace) -> int:
    from reconciler.service import agenttokens
    from reconciler.store import connections, migrations

    out: Path | None = getattr(args, "out", None)
    if out is not None and (out.exists() or out.is_symlink()):
        raise UsageError(
            f"--out {out} exists: the token is written only to a new file", code=reconciler_codes.HOST_TOKEN_OUT_EXISTS
        )
    with connections.connect(db.database_url(args), autocommit=True) as conn:
        migrations.migrate(conn)
        if args.token_action == "revoke":  # noqa: S105 - an action name
            revoked = agenttokens.revoke_token(conn, args.node)
            doc: dict[str, Any] = {"node": args.node, "revoked": revoked}
            if output.structured(args.output):
                output.emit(doc, args.output)
            else:
                print(f"{args.node}: token revoked" if revoked else f"{args.node} had no token")
            return 0
        token = agenttokens.issue_token(conn, args.node, rotate=args.token_action == "rotate")  # noqa: S105 - an action name
    if out is not None:
        _write_new(out, token)
    doc = {
        "node": args.node,
        "action": args.token_action,
        "token": None if out else token,
        "file": str(out) if out else None,
    }
    if output.structured(args.output):
        output.emit(doc, args.output)
    elif out is not None:
        print(f"{args.node}: token written to {out} (mode 0600)")
    else:
        print(token)
    return 0
