"""`gpuaas drift [-o text|markdown|json|yaml] [--node NAME]`: the fleet's drift for operator review.

Reads what every host reported (host_status.drift: per slot, with stable
codes) as the central reconciler's role, and renders it. Exit status 0 when
no drift was found; with --exit-code, 3 when some node reports drift (so cron
and CI can alert on it). A host's report is untrusted input: a malformed one
shows as `drift.report.invalid` for that node (and counts as drift).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from schemas import output


def register(sub: Any) -> None:
    p = sub.add_parser("drift", help="render the drift the hosts reported")
    output.add_argument(p, "text", "markdown")
    p.add_argument("--node", help="only this node")
    p.add_argument("--exit-code", action="store_true", help="exit 3 when any drift is reported")
    p.add_argument("--db-url", help="PostgreSQL URL (default $GPUAAS_DATABASE_URL or the embedded one)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from host_reconciler import hostdb, reports
    from reconciler.store import connections

    with hostdb.connect(connections.database_url(args.db_url, start=False)) as conn:
        # Hosts write their own reports: one malformed report is a finding of its node, not a crash.
        nodes = reports.checked(hostdb.read_status(conn, args.node))
    if args.output == "yaml":  # the JSON report's data, as YAML
        output.emit(json.loads(reports.drift_json(nodes)), "yaml")
    else:
        print(reports.RENDERERS[args.output](nodes), end="" if args.output == "markdown" else "\n")
    return 3 if args.exit_code and any(n["drift"] for n in nodes) else 0
