"""`gpuaas serve [--listen HOST:PORT] [--token-file FILE] [--allow-host NAME]...`: the API, dashboard, metrics.

One process that reads the store (read-only transactions) and serves the
host agents (their plans by watch, their reports and heartbeats as their
node's identity: /api/v1/agent), the JSON API under /api/v1, the operator dashboard at /,
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

from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import notify, signals


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="JSON API, host agents' API, operator dashboard, /metrics, /healthz, /readyz")
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080; port 0 picks one)")
    p.add_argument(
        "--token-file",
        type=Path,
        help="bearer token every request but /healthz must carry (mode 0600); required off loopback",
    )
    p.add_argument(
        "--max-reconcile-age",
        type=float,
        default=0.0,
        metavar="S",
        help="/readyz fails when the newest successful reconciliation is older (default 0: not checked)",
    )
    p.add_argument(
        "--failing-grace",
        type=float,
        default=300.0,
        metavar="S",
        help="/readyz fails when reconciliation has been failing this long (default 300)",
    )
    p.add_argument(
        "--unapplied-grace",
        type=float,
        default=300.0,
        metavar="S",
        help="/readyz fails when HEAD (the newest revision recorded) has not been applied this long:"
        " invalid, behind the applied revision, or failing (default 300)",
    )
    p.add_argument("--refresh", type=int, default=15, metavar="S", help="dashboard self-refresh period (default 15)")
    p.add_argument(
        "--capacity-refresh",
        type=float,
        default=10.0,
        metavar="S",
        help="recompute capacity at most this often when the store changed (default 10)",
    )
    p.add_argument("--policy", help="placement policy override for capacity (default: the Fleet's)")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="answer requests for this Host name too (repeatable; loopback names and the listen address "
        "are always answered; '*': any, which gives up the DNS-rebinding defence)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=16384,
        metavar="N",
        help="concurrent connections (a waiting agent holds one); more get 503 (default 16384)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="total time for one request, slow clients cut (default 60)",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="time to send a request head once started (default 10)",
    )
    p.add_argument(
        "--tenant-tokens",
        type=Path,
        metavar="FILE",
        help="TENANT:SHA256 lines: tokens that see and change only their tenant's allocations "
        "(gpuaas tenant token issue; re-read when the file changes)",
    )
    p.add_argument(
        "--intake-repo",
        type=Path,
        metavar="PATH",
        help="desired-state checkout that POST/DELETE /api/v1/allocations commit to (as the portal bot)",
    )
    p.add_argument(
        "--intake-push",
        metavar="REMOTE/BRANCH",
        help="push each intake commit here (e.g. origin/main); a refused push is redone on the new tip",
    )
    p.add_argument("--webhook", metavar="URL", help="POST every allocation event here, signed (docs/portal.md)")
    p.add_argument(
        "--webhook-secret-file",
        type=Path,
        metavar="FILE",
        help="HMAC-SHA256 key of X-Gpuaas-Signature (mode 0600, at least 16 bytes)",
    )
    p.add_argument(
        "--console-credentials",
        type=Path,
        metavar="FILE",
        help="serve slice VM consoles (WebSocket /api/v1/allocations/ID/console) to these credentials "
        "(JSON, mode 0600, docs/access.md); without it there is no console route",
    )
    p.add_argument(
        "--console-libvirt-uri",
        default="qemu+ssh://gpuaas@{node}/system",
        metavar="TEMPLATE",
        help="each node's libvirt for consoles, {node} replaced (default qemu+ssh://gpuaas@{node}/system)",
    )
    p.add_argument("--log-format", choices=("text", "json"), help="log lines (default $GPUAAS_LOG_FORMAT or text)")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from reconciler.service import logs

    with logs.configured(logs.choose(args.log_format)):  # in-process callers get no handler left behind
        return _serve(args)


def _answers(url: str) -> bool:
    """The server's own /healthz answers 200 within 5 s (what a watchdog ping vouches for)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310  # our own http:// URL
        return bool(r.status == 200)


def _raise_open_files(connections: int) -> None:
    """Every connection is a file descriptor: raise the soft limit toward the hard one for --max-connections."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + 256  # the pools, the listener, logs
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


def _remote_branch(text: str | None) -> tuple[str, str] | None:
    from schemas.errors import UsageError

    if text is None:
        return None
    from desired.reading import gitrepo

    remote, sep, branch = text.partition("/")
    if not sep or not remote or not branch:
        raise UsageError(
            f"--intake-push takes REMOTE/BRANCH (e.g. origin/main), not {text!r}",
            code=reconciler_codes.SERVE_INTAKE_PUSH_INVALID,
        )
    gitrepo.check_ref_name(remote, "--intake-push remote")
    gitrepo.check_ref_name(branch, "--intake-push branch")
    return remote, branch


def _serve(args: argparse.Namespace) -> int:
    from reconciler.service import server

    host, port = server.parse_listen(args.listen)
    settings = server.Settings(
        host=host,
        port=port,
        token=server.token_from(args.token_file),
        max_reconcile_age_s=args.max_reconcile_age,
        failing_grace_s=args.failing_grace,
        head_grace_s=args.unapplied_grace,
        refresh_s=args.refresh,
        capacity_refresh_s=args.capacity_refresh,
        policy=args.policy,
        allowed_hosts=tuple(args.allow_host),
        max_connections=args.max_connections,
        request_timeout_s=args.request_timeout,
        header_timeout_s=args.header_timeout,
        tenant_tokens=args.tenant_tokens,
        intake_repo=args.intake_repo,
        intake_push=_remote_branch(args.intake_push),
        webhook_url=args.webhook,
        webhook_secret=args.webhook_secret_file,
        console_credentials=args.console_credentials,
        console_libvirt_uri=args.console_libvirt_uri,
    )
    _raise_open_files(settings.max_connections)
    import gc

    # This process is the server (not a library in someone's): thousands of connections make many young
    # objects, so collect less often, and never rescan what startup made.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    settings.check()  # before the database: a refused bind starts nothing
    httpd = server.make_server(db.database_url(args), settings)

    def shut_down(_sig: signal.Signals) -> None:  # off the serving thread: shutdown() waits for serve_forever
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    try:
        with signals.stop_on(threading.Event(), on_first=shut_down):  # before the line a supervisor waits for
            print(
                f"serving on {httpd.url} (dashboard /, API /api/v1, agent API /api/v1/agent, /metrics, /healthz, "
                "/readyz)",
                flush=True,
            )
            # systemd Type=notify: ready once bound; the watchdog vouches only for a server that answers /healthz.
            with notify.serving(f"serving on {httpd.url}", alive=lambda: _answers(httpd.url + "/healthz")):
                httpd.serve_forever(poll_interval=0.5)
    finally:
        httpd.server_close()
        httpd.service.close()
    return 0
