"""The claims part of `make demo`: embedded PostgreSQL, apply the example fleet, re-apply, check.

It runs in its own database (`gpuaas_demo_claims`, re-created on every run)
on the embedded server, so it tells the same story each time and leaves the
default database to the GitOps and host parts of the demo. With an external
GPUAAS_DATABASE_URL it uses that database as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from reconciler import sources
from schemas.errors import PermanentError

DEMO_DB = "gpuaas_demo_claims"

Out = Callable[[str], None]


def _heading(out: Out, text: str) -> None:
    out(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def _database(out: Out) -> str:
    from psycopg import sql

    from reconciler.store import connections, embedded
    from schemas import dberrors

    external = connections.external_url()
    if external:
        out(f"external database (GPUAAS_DATABASE_URL): {external}")
        return external
    state = connections.state_dir()
    server = embedded.ensure(state)
    out(f"embedded PostgreSQL under {state}/ (pid {server.pid()}), socket {server.socket_dir}")
    with connections.connect(server.url("postgres"), autocommit=True) as conn, dberrors.wrapped("reset demo db"):
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DEMO_DB)))
    embedded.create_database(server, DEMO_DB)
    return server.url(DEMO_DB)


def run(fleet: Path, out: Out = print) -> None:
    from reconciler.commands import apply
    from reconciler.reconcile import reconciling
    from reconciler.store import checks, connections, migrations

    _heading(out, "claims store: embedded PostgreSQL")
    url = _database(out)
    loaded = sources.load(fleet)
    if loaded.errors:
        raise PermanentError(f"{len(loaded.errors)} validation error(s) in {fleet}", code="demo.invalid")
    with connections.connect(url, autocommit=True) as conn:
        ran = migrations.migrate(conn)
        out(f"schema: {len(ran)} migration(s) applied" if ran else "schema: up to date")
        for title in (f"gpuaas apply {fleet}", "apply the same revision again: nothing changes"):
            _heading(out, title)
            result = reconciling.reconcile(conn, loaded.state, source="demo", planner=reconciling.planner_for())
            out(apply.render_text(reconciling.summary(result)))
        _heading(out, "gpuaas db check")
        violations = checks.run(conn)
        for v in violations:
            out(f"violation: {v.render()}")
        if not violations:
            out(
                f"ok: {len(checks.CHECKS)} invariants hold (no double claim, no exclusive/slot overlap, "
                "every held slot has one live claim, every placement has claims and its outbox event)"
            )
