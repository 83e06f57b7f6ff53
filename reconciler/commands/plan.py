"""`gpuaas plan [PATH] [--base REV] [--head REV] [-o text|markdown|json] [--detailed-exitcode] [--offline]`.

What merging head would do. Head is `--head` (default HEAD; a directory
outside git is read as it is). Against the database (default): claims and
slot states come from the store, and the base is `--base`, else the revision
the database last reconciled when this repo has it, else the inventory the
database holds. With `--offline` (CI, no database): the base is `--base`
(default: nothing) planned from no claims, and its placements are the
claims head is planned against.

Exit status: 1 on an error (head invalid: every FILE:LINE is printed and
nothing is planned). With --detailed-exitcode, like `terraform plan
-detailed-exitcode`: 0 no change, 2 changes; without it, 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from desired import gitrepo
from desired.loading import DesiredState
from reconciler import plans, prplan, prplan_render, sources
from reconciler.commands import db
from reconciler.errors import PermanentError, UsageError

EXIT_CHANGES = 2


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="what merging a revision would do (a PR plan), with terraform-style exit codes")
    p.add_argument("path", nargs="?", default=Path("."), type=Path, help="desired-state repo (default .)")
    p.add_argument("--base", help="base revision (default: what the database runs; offline: nothing)")
    p.add_argument("--head", help="revision to plan (default HEAD; the directory itself outside git)")
    p.add_argument("-o", "--output", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--detailed-exitcode", action="store_true", help="exit 0 no change, 1 error, 2 changes")
    p.add_argument("--offline", action="store_true", help="no database: plan head against what base implies")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _load(path: Path, rev: str | None) -> tuple[DesiredState, tuple[Any, ...]]:
    result = sources.load(path, rev)
    return result.state, tuple(result.errors)


def _online(args: argparse.Namespace) -> tuple[DesiredState, tuple[Any, ...], plans.Observed]:
    from reconciler.store import connections, migrations, observing, readmodels

    with connections.connect(db.database_url(args), autocommit=True) as conn:
        if not migrations.applied(conn):
            print("note: the database has no schema yet; planning against an empty fleet", file=sys.stderr)
            base, errors = _load(args.path, args.base) if args.base else (DesiredState(), ())
            return base, errors, plans.Observed()
        observed = observing.observe(conn)
        if args.base:
            base, errors = _load(args.path, args.base)
            return base, errors, observed
        current = readmodels.current_revision(conn)
        if current and not current.startswith("tree:") and gitrepo.head(args.path) is not None:
            try:
                base, errors = _load(args.path, current)
                return base, errors, observed
            except PermanentError:  # a revision this clone lacks: fall back to the stored inventory
                pass
        return readmodels.desired_state(conn), (), observed


def run(args: argparse.Namespace) -> int:
    head_rev = args.head or ("HEAD" if gitrepo.head(args.path) is not None else None)
    head, head_errors = _load(args.path, head_rev)
    if head_errors:
        pr = prplan.invalid(args.base, head.revision, head_errors, offline=args.offline)
    else:
        if args.offline:
            base, base_errors = _load(args.path, args.base) if args.base else (DesiredState(), ())
            observed = _guard(lambda: prplan.offline_observed(base, policy=args.policy))
        else:
            base, base_errors, observed = _online(args)
        pr = _guard(lambda: prplan.compose(base, head, observed, offline=args.offline, base_errors=base_errors,
                                           policy=args.policy))
    _print(pr, args.output)
    if not pr.valid:
        print(f"error: plan.invalid: {len(pr.errors)} validation error(s) in head; nothing planned", file=sys.stderr)
        return 1
    return EXIT_CHANGES if args.detailed_exitcode and pr.changed else 0


def _guard(fn: Any) -> Any:
    try:
        return fn()
    except ValueError as e:  # an unknown --policy name
        raise UsageError(str(e), code="plan.policy_unknown") from e


def _print(pr: prplan.PrPlan, output: str) -> None:
    if output == "json":
        print(json.dumps(prplan_render.as_dict(pr), indent=2, default=str))
    elif output == "markdown":
        print(prplan_render.render_markdown(pr), end="")
    else:
        print(prplan_render.render_text(pr))
