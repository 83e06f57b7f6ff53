"""`gpuaas db start|stop|status|url|migrate|check`: the database the reconciler keeps its claims in.

Without GPUAAS_DATABASE_URL (or --db-url), commands use a private PostgreSQL
under the state dir (`.gpuaas/`, GPUAAS_STATE_DIR, --state-dir), started on
first use and reused afterwards.

No command prints a database password: `db status` and `db url` show the
URL with it replaced by `***` (`db url --show-password` prints it whole, for
scripts). `db status` connects to an external database and exits 3 when it
cannot (as for an embedded server that is not running).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from schemas import output


def add_database_arguments(p: argparse.ArgumentParser) -> None:
    """--db-url and --state-dir, shared by every command that talks to the store."""
    p.add_argument("--db-url", help="PostgreSQL URL (default $GPUAAS_DATABASE_URL, else the embedded server)")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="embedded server state directory (default $GPUAAS_STATE_DIR or .gpuaas)",
    )


def database_url(args: argparse.Namespace) -> str:
    from reconciler.store import connections

    return connections.database_url(getattr(args, "db_url", None), getattr(args, "state_dir", None))


def reading_url(args: argparse.Namespace) -> str:
    """For commands that only read: an embedded server that is not running is `db.not_running`, not started."""
    from reconciler.store import connections

    return connections.database_url(getattr(args, "db_url", None), getattr(args, "state_dir", None), start=False)


def register(sub: Any) -> None:
    p = sub.add_parser("db", help="the PostgreSQL store: start, stop, status, url, migrate, check")
    dsub = p.add_subparsers(dest="db_command", metavar="DB_COMMAND")
    dsub.required = True
    for name, helptext, func in (
        ("start", "start the embedded server (initialised on first use)", _start),
        ("stop", "stop the embedded server", _stop),
        ("status", "is the embedded server running, and where", _status),
        ("url", "print the database URL in use", _url),
        ("migrate", "apply pending schema migrations", _migrate),
        ("check", "run the invariant queries; exit 1 naming any violation", _check),
    ):
        c = dsub.add_parser(name, help=helptext)
        add_database_arguments(c)
        if name in ("status", "check"):
            output.add_argument(c, "text")
        if name == "url":
            c.add_argument(
                "--show-password", action="store_true", help="print the password too (default: replaced by ***)"
            )
        c.set_defaults(func=func)


def _external(args: argparse.Namespace) -> str | None:
    from reconciler.store import connections

    return getattr(args, "db_url", None) or connections.external_url()


def _start(args: argparse.Namespace) -> int:
    from reconciler.store import connections, embedded

    if _external(args):
        print("an external database is configured (GPUAAS_DATABASE_URL/--db-url): nothing to start")
        return 0
    server = embedded.ensure(connections.state_dir(args.state_dir))
    print(f"running (pid {server.pid()}): {server.url()}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    from reconciler.store import connections, embedded

    if _external(args):
        print("an external database is configured (GPUAAS_DATABASE_URL/--db-url): nothing to stop")
        return 0
    stopped = embedded.stop(embedded.server_for(connections.state_dir(args.state_dir)))
    print("stopped" if stopped else "not running")
    return 0


def _status(args: argparse.Namespace) -> int:
    """Exit 0 when the server runs, 3 when it does not (pg_ctl status does the same)."""
    from reconciler.store import connections, embedded

    external = _external(args)
    if external:
        doc: dict[str, Any] = {"external": True, "url": redact(external), **_probe(external)}
        running = doc["reachable"]
    else:
        st = embedded.status(connections.state_dir(args.state_dir))
        running = st.running
        doc = {
            "external": False,
            "initialized": st.initialized,
            "running": st.running,
            "pid": st.pid,
            "url": redact(st.url),
            "state_dir": str(st.state_dir),
            "data_dir": str(st.data_dir),
            "log_file": str(st.log_file),
        }
    if output.structured(args.output):
        output.emit(doc, args.output)
    elif external:
        print(f"external database: {doc['url']}")
        if running:
            print(
                f"  reachable: PostgreSQL {doc['server_version']} as {doc['user']}, "
                f"{doc['pending_migrations']} migration(s) pending"
            )
        else:
            print(f"error: {doc['error']['code']}: {doc['error']['message']}", file=sys.stderr)
    else:
        state = "running" if doc["running"] else ("stopped" if doc["initialized"] else "not initialised")
        pid = f" (pid {doc['pid']})" if doc["pid"] else ""
        print(f"{state}{pid}\n  url:      {doc['url']}\n  data dir: {doc['data_dir']}\n  log:      {doc['log_file']}")
    return 0 if running else 3


def _url(args: argparse.Namespace) -> int:
    from reconciler.store import connections, embedded

    url = _external(args) or embedded.server_for(connections.state_dir(args.state_dir)).url()
    print(url if args.show_password else redact(url))
    return 0


HIDDEN = "***"
_DSN_PASSWORD = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")
_QUERY_PASSWORD = re.compile(r"((?:^|&)password=)[^&]*")


def redact(url: str) -> str:
    """`url` with its password replaced: in the user info, a `password=` parameter, or a key=value DSN."""
    if "://" not in url:
        return _DSN_PASSWORD.sub(rf"\g<1>{HIDDEN}", url)
    # Taken apart by hand: urllib drops an empty host (`postgresql:///db?host=/run/...`) and refuses odd ones.
    scheme, after = url.split("://", 1)
    end = min((i for i in (after.find(c) for c in "/?#") if i >= 0), default=len(after))
    user, at, hosts = after[:end].rpartition("@")
    if at and ":" in user:
        user = user.split(":", 1)[0] + ":" + HIDDEN
    path, q, tail = after[end:].partition("?")
    query, hash_, fragment = tail.partition("#")
    query = _QUERY_PASSWORD.sub(rf"\g<1>{HIDDEN}", query)
    rest = f"{path}{q}{query}{hash_}{fragment}"
    return f"{scheme}://{user}{at}{hosts}{rest}"


def _probe(url: str) -> dict[str, Any]:
    """Connect to an external database: who we are there and what is left to migrate, or why not."""
    from reconciler.store import connections, migrations
    from schemas.errors import GpuaasError

    try:
        with connections.connect(url, autocommit=True) as conn:
            done = migrations.applied(conn)
            user = conn.execute("SELECT current_user").fetchone()
            version = conn.info.server_version
    except GpuaasError as e:
        return {"reachable": False, "error": {"code": e.code, "message": _scrub(e.message, url)}}
    pending = sum(1 for m in migrations.available() if m.version not in done)
    return {
        "reachable": True,
        "user": user[0] if user else None,
        "server_version": f"{version // 10000}.{version % 10000}",
        "pending_migrations": pending,
    }


def _scrub(message: str, url: str) -> str:
    """A driver message may quote the connection string it could not parse: never with the password."""
    import psycopg
    from psycopg import conninfo

    try:
        password = conninfo.conninfo_to_dict(url).get("password")
    except psycopg.Error:  # unparsable: redact it where it is quoted whole
        return message.replace(url, redact(url))
    return message.replace(str(password), HIDDEN) if password else message


def _migrate(args: argparse.Namespace) -> int:
    from reconciler.store import connections, migrations

    with connections.connect(database_url(args), autocommit=True) as conn:
        ran = migrations.migrate(conn)
    print(f"applied {', '.join(ran)}" if ran else "schema is up to date")
    return 0


def _check(args: argparse.Namespace) -> int:
    from reconciler.store import checks, connections, migrations

    with connections.connect(database_url(args), autocommit=True) as conn:
        migrations.migrate(conn)
        violations = checks.run(conn)
    if output.structured(args.output):
        output.emit(
            {
                "ok": not violations,
                "checks": [c.name for c in checks.CHECKS],
                "violations": [
                    {"name": v.name, "description": v.description, "count": v.count, "sample": list(v.sample)}
                    for v in violations
                ],
            },
            args.output,
        )
    elif violations:
        for v in violations:
            print(f"violation: {v.render()}", file=sys.stderr)
    else:
        print(f"ok: {len(checks.CHECKS)} invariants hold")
    return 1 if violations else 0
