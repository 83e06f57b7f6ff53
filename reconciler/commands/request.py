"""`gpuaas request create|release`: what the portal bot runs against the desired-state repo.

Every refusal exits 1 with `error: CODE: message` on stderr; with `-o json`
the bot also gets `{"error": CODE, ...}` on stdout (a rejected request lists
its problems; a refused file, such as a symlinked `allocations/<id>.yaml`,
`request.file.not_regular`, says why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import codes as reconciler_codes
from schemas import output
from schemas.errors import PermanentError

if TYPE_CHECKING:
    from reconciler.reconcile import requests


def register(sub: Any) -> None:
    p = sub.add_parser("request", help="write (and commit) allocation requests as the portal bot")
    rsub = p.add_subparsers(dest="request_command", metavar="ACTION")
    rsub.required = True

    c = rsub.add_parser("create", help="write allocations/<id>.yaml")
    c.add_argument("--repo", type=Path, default=Path("."), help="desired-state checkout (default .)")
    c.add_argument("--tenant", required=True)
    c.add_argument("--sku", required=True)
    c.add_argument("--gpus", type=int, required=True)
    c.add_argument("--region", required=True)
    c.add_argument("--image")
    c.add_argument("--ssh-key", type=Path, action="append", default=[], help="public key file (repeatable)")
    c.add_argument("--id", dest="allocation_id")
    c.add_argument("--vm-profile", help="a VM profile of the SKU (default: the SKU's)")
    c.add_argument("--lease-hours", type=float, help="reserved term in hours (default: on demand, until released)")
    _git_flags(c)
    c.set_defaults(func=run_create)

    r = rsub.add_parser("release", help="set state: released, keeping comments and key order")
    r.add_argument("allocation_id")
    r.add_argument("--repo", type=Path, default=Path("."))
    _git_flags(r)
    r.set_defaults(func=run_release)


def _git_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--commit", action="store_true", help="commit as the portal bot")
    p.add_argument("--push", action="store_true", help="push the commit (implies --commit)")
    p.add_argument("--remote", default="origin")
    p.add_argument("--branch", default="main")
    output.add_argument(p, "text")


def _report(args: argparse.Namespace, written: requests.Written, verb: str) -> int:
    if output.structured(args.output):
        output.emit(
            {"id": written.allocation_id, "path": str(written.path), "commit": written.commit}, args.output, indent=None
        )
    else:
        print(
            f"{verb} {written.allocation_id}: {written.path}"
            + (f" (commit {written.commit[:12]})" if written.commit else "")
        )
    return 0


def _rejected(args: argparse.Namespace, e: requests.RequestRejected) -> int:
    if output.structured(args.output):
        output.emit({"error": e.code, "problems": [x.as_dict() for x in e.problems]}, args.output, indent=None)
    else:
        for problem in e.problems:
            print(problem.render(), file=sys.stderr)
        print(f"error: {e.code}: request not written", file=sys.stderr)
    return 1


def _refused(args: argparse.Namespace, e: PermanentError) -> int:
    if output.structured(args.output):
        output.emit({"error": e.code, "message": e.message}, args.output, indent=None)
    print(f"error: {e.code}: {e.message}", file=sys.stderr)
    return 1


SSH_KEY_LIMIT = 64 * 1024  # an authorized_keys file of a few hundred keys; never a disk image


def public_keys(path: Path) -> list[str]:
    """The OpenSSH public key lines of `path` (blank and `#` lines skipped).

    Anything else is refused naming its line numbers only: a private key or
    a secret passed by mistake is never echoed into CI or portal logs.
    """
    import re

    from desired.patterns import SSH_KEY_RE
    from schemas import inputfiles

    text = inputfiles.read_text(path, limit=SSH_KEY_LIMIT, code=reconciler_codes.REQUEST_SSH_KEY, what="--ssh-key")
    keys: list[str] = []
    bad: list[int] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if re.fullmatch(SSH_KEY_RE, line):
            keys.append(line)
        else:
            bad.append(number)
    if bad:
        private = "PRIVATE KEY" in text
        shown = ", ".join(str(n) for n in bad[:20]) + (" ..." if len(bad) > 20 else "")
        raise PermanentError(
            f"--ssh-key {path}: {'it holds a private key; ' if private else ''}line(s) {shown} are not OpenSSH "
            "public keys (their content is not shown); give the .pub file",
            code=reconciler_codes.REQUEST_SSH_KEY_NOT_PUBLIC,
        )
    return keys


def run_create(args: argparse.Namespace) -> int:
    from reconciler.reconcile import requests

    keys: list[str] = []
    try:
        for path in args.ssh_key:
            keys.extend(public_keys(path))
    except PermanentError as e:
        return _refused(args, e)
    try:
        written = requests.create(
            args.repo,
            tenant=args.tenant,
            sku=args.sku,
            gpus=args.gpus,
            region=args.region,
            image=args.image,
            ssh_keys=keys,
            allocation_id=args.allocation_id,
            vm_profile=args.vm_profile,
            lease_hours=args.lease_hours,
            commit=args.commit or args.push,
            push=(args.remote, args.branch) if args.push else None,
        )
    except requests.RequestRejected as e:
        return _rejected(args, e)
    except PermanentError as e:
        return _refused(args, e)
    return _report(args, written, "requested")


def run_release(args: argparse.Namespace) -> int:
    from reconciler.reconcile import requests

    try:
        written = requests.release(
            args.repo,
            args.allocation_id,
            commit=args.commit or args.push,
            push=(args.remote, args.branch) if args.push else None,
        )
    except requests.RequestRejected as e:
        return _rejected(args, e)
    except PermanentError as e:
        return _refused(args, e)
    return _report(args, written, "released")
