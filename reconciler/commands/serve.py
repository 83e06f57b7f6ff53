"""`gpuaas serve [--listen HOST:PORT] [--token-file FILE] [--max-reconcile-age S]`: the read API, dashboard, metrics.

One process that reads the store (read-only transactions, never a write)
and serves the JSON API under /api/v1, the operator dashboard at /,
Prometheus metrics at /metrics, and /healthz and /readyz. It binds
127.0.0.1 by default; any other address needs --token-file. SIGTERM and
SIGINT stop it after the requests in flight. See docs/service.md.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from reconciler.commands import db
from schemas import signals


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="read-only JSON API, operator dashboard, /metrics, /healthz, /readyz")
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080; port 0 picks one)")
    p.add_argument("--token-file", type=Path,
                   help="bearer token every request but /healthz must carry (mode 0600); required off loopback")
    p.add_argument("--max-reconcile-age", type=float, default=0.0, metavar="S",
                   help="/readyz fails when the newest successful reconciliation is older (default 0: not checked)")
    p.add_argument("--failing-grace", type=float, default=300.0, metavar="S",
                   help="/readyz fails when reconciliation has been failing this long (default 300)")
    p.add_argument("--unapplied-grace", type=float, default=300.0, metavar="S",
                   help="/readyz fails when HEAD (the newest revision recorded) has not been applied this long:"
                        " invalid, behind the applied revision, or failing (default 300)")
    p.add_argument("--refresh", type=int, default=15, metavar="S", help="dashboard self-refresh period (default 15)")
    p.add_argument("--capacity-refresh", type=float, default=10.0, metavar="S",
                   help="recompute capacity at most this often when the store changed (default 10)")
    p.add_argument("--policy", help="placement policy override for capacity (default: the Fleet's)")
    p.add_argument("--log-format", choices=("text", "json"), help="log lines (default $GPUAAS_LOG_FORMAT or text)")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reconciler.service import logs

    with logs.configured(logs.choose(args.log_format)):  # in-process callers get no handler left behind
        return _serve(args)


def _serve(args: argparse.Namespace) -> int:
    from reconciler.service import server

    host, port = server.parse_listen(args.listen)
    settings = server.Settings(
        host=host, port=port, token=server.token_from(args.token_file),
        max_reconcile_age_s=args.max_reconcile_age, failing_grace_s=args.failing_grace,
        head_grace_s=args.unapplied_grace, refresh_s=args.refresh,
        capacity_refresh_s=args.capacity_refresh, policy=args.policy)
    settings.check()  # before the database: a refused bind starts nothing
    httpd = server.make_server(db.database_url(args), settings)

    def shut_down(_sig: signal.Signals) -> None:  # off the serving thread: shutdown() waits for serve_forever
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    try:
        with signals.stop_on(threading.Event(), on_first=shut_down):  # before the line a supervisor waits for
            print(f"serving on {httpd.url} (read-only; dashboard /, API /api/v1, /metrics, /healthz, /readyz)",
                  flush=True)
            httpd.serve_forever(poll_interval=0.5)
    finally:
        httpd.server_close()
        httpd.service.close()
    return 0
