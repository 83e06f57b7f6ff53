"""`gpuaas db status` and `db url` on an external database: no password printed, a real connection check."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql

from reconciler import cli
from reconciler.commands import db
from reconciler.store import embedded

SECRET = "s3cr%3At"  # noqa: S105 -- a test password (percent-encoded ':' inside)
PLAIN = "s3cr:t"  # the same, decoded


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://gpuaas:hunter2@db.example:5432/gpuaas", "postgresql://gpuaas:***@db.example:5432/gpuaas"),
        ("postgres://gpuaas@db/gpuaas?sslmode=require", "postgres://gpuaas@db/gpuaas?sslmode=require"),
        (
            "postgresql://u:p%40ss@h1:5432,h2:5433/d?sslmode=verify-full",
            "postgresql://u:***@h1:5432,h2:5433/d?sslmode=verify-full",
        ),
        (
            "postgresql://u@[::1]/d?password=hunter2&sslmode=require",
            "postgresql://u@[::1]/d?password=***&sslmode=require",
        ),
        ("postgresql:///d?host=/run/postgresql", "postgresql:///d?host=/run/postgresql"),
        ("host=db user=u password=hunter2 dbname=d", "host=db user=u password=*** dbname=d"),
        ("host=db password = 'a b\\' c' dbname=d", "host=db password = *** dbname=d"),
        ("postgresql://u:x@[::1/d", "postgresql://u:***@[::1/d"),  # not a URL urllib can take apart
        ("postgresql://u:a:b@h/d#password=x", "postgresql://u:***@h/d#password=x"),
    ],
)
def test_redact_hides_every_form_of_password(url: str, expected: str) -> None:
    assert db.redact(url) == expected


def test_db_url_hides_the_password_unless_asked(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://gpuaas:{SECRET}@127.0.0.1:1/gpuaas"
    assert cli.main(["db", "url", "--db-url", url]) == 0
    assert capsys.readouterr().out.strip() == "postgresql://gpuaas:***@127.0.0.1:1/gpuaas"
    assert cli.main(["db", "url", "--db-url", url, "--show-password"]) == 0
    assert capsys.readouterr().out.strip() == url


def test_db_status_of_an_unreachable_database_exits_3_without_the_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nowhere = f"postgresql://gpuaas:{SECRET}@/gpuaas?host={quote(str(tmp_path), safe='')}&port=5"
    assert cli.main(["db", "status", "--db-url", nowhere]) == 3
    out, err = capsys.readouterr()
    assert "external database: postgresql://gpuaas:***@/gpuaas?host=" in out
    assert err.startswith("error: db.unavailable: connect to PostgreSQL")
    assert cli.main(["db", "status", "--db-url", nowhere, "-o", "json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["external"] is True and doc["reachable"] is False and doc["error"]["code"] == "db.unavailable"
    assert SECRET not in out + err + json.dumps(doc) and PLAIN not in out + err + json.dumps(doc)


def test_db_status_of_a_reachable_database_says_who_and_what_is_pending(
    db_url: str, empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_password = db_url.replace("@/", f":{SECRET}@/", 1)  # the test server trusts local sockets
    assert with_password != db_url
    assert cli.main(["db", "status", "--db-url", with_password, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reachable"] is True and doc["pending_migrations"] == 0 and doc["user"]
    assert doc["url"] == db.redact(with_password) and SECRET not in json.dumps(doc)
    assert cli.main(["db", "status", "--db-url", empty_db_url]) == 0  # reachable, nothing migrated yet
    out = capsys.readouterr().out
    assert "reachable: PostgreSQL " in out and " 0 migration(s) pending" not in out


def test_migrate_needs_createrole_and_a_database_it_owns(
    pg_server: embedded.Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the README promises an external PostgreSQL's administrator: owner of the database, CREATEROLE."""
    made: list[str] = []
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        try:
            results = {}
            for attrs in ("LOGIN CREATEROLE", "LOGIN"):
                role = f"mig_{uuid.uuid4().hex[:8]}"
                admin.execute(sql.SQL("CREATE ROLE {} " + attrs).format(sql.Identifier(role)))
                made.append(role)
                admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(role), sql.Identifier(role)))
                url = pg_server.url(role).replace(f"{embedded.OWNER}@", f"{role}@", 1)
                results[attrs] = (cli.main(["db", "migrate", "--db-url", url]), capsys.readouterr())
        finally:
            for role in made:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
    status, out = results["LOGIN CREATEROLE"]
    assert status == 0 and "applied 0001" in out.out
    status, out = results["LOGIN"]
    assert status == 1 and "permission denied to create role" in out.err
