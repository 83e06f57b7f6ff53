"""A node role has least privilege (migration 0051), in a real PostgreSQL server.

node-a's role: CONNECT to its own database, nothing else
  - another database of the server (postgres, the migrated template): refused
  - CREATE TEMP TABLE, CREATE TABLE public.x, CREATE SCHEMA: refused
a login role that existed before the lock-down: still connects (no TEMP);
one made after it: needs GRANT CONNECT
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from host_reconciler import hostdb
from reconciler.store import connections, migrations
from reconciler.store import hostplans as central_plans
from tests.fixtures.pg import TEMPLATE_DB
from tests.host.test_hostdb import add_node, plan, status


@pytest.fixture
def node_a(db_url: str) -> hostdb.NodeCredentials:
    with hostdb.connect(db_url) as conn:
        add_node(conn, "node-a")
        central_plans.store(conn, [plan("node-a")])
        return hostdb.create_node_role(conn, "node-a", "pw-node-a")


def _connect(url: str, creds: hostdb.NodeCredentials, dbname: str | None = None) -> psycopg.Connection[Any]:
    target = make_conninfo(url, dbname=dbname) if dbname else url
    return psycopg.connect(target, user=creds.role, password=creds.password, autocommit=True)


def test_a_node_role_works_in_its_own_database(db_url: str, node_a: hostdb.NodeCredentials) -> None:
    with _connect(db_url, node_a) as conn:
        assert conn.execute("SELECT count(*) FROM host_plans").fetchone() == (1,)
        hostdb.write_status(conn, status("node-a"))


@pytest.mark.parametrize("other", ["postgres", TEMPLATE_DB])
def test_a_node_role_cannot_connect_to_another_database(
    db_url: str, node_a: hostdb.NodeCredentials, other: str
) -> None:
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        _connect(db_url, node_a, other).close()


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TEMP TABLE t (x int)",
        "CREATE TABLE public.x (x int)",
        "CREATE TABLE x (x int)",
        "CREATE SCHEMA evil",
        "CREATE FUNCTION public.gpuaas_current_node() RETURNS text LANGUAGE sql AS $$ SELECT 'node-b' $$",
    ],
)
def test_a_node_role_can_create_nothing(db_url: str, node_a: hostdb.NodeCredentials, statement: str) -> None:
    with _connect(db_url, node_a) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)


def test_the_lock_down_keeps_roles_that_could_connect_and_never_grants_temp(empty_db_url: str) -> None:
    reader, later = (f"gpuaas_test_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("reader", "later"))
    with connections.connect(empty_db_url, autocommit=True) as owner:
        owner.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(reader)))
        try:
            migrations.migrate(owner)  # a fresh database: 0051 locks it down
            owner.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(later)))
            with psycopg.connect(empty_db_url, user=reader, autocommit=True) as conn:
                assert conn.execute("SELECT current_user").fetchone() == (reader,)
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute("CREATE TEMP TABLE t (x int)")
            with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
                psycopg.connect(empty_db_url, user=later).close()  # made after: needs GRANT CONNECT
        finally:
            for role in (reader, later):
                _drop_role(owner, role)


def _drop_role(owner: psycopg.Connection[Any], role: str) -> None:
    if owner.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        for stmt in ("DROP OWNED BY {}", "DROP ROLE {}"):  # DROP OWNED also revokes its database grants
            owner.execute(sql.SQL(stmt).format(sql.Identifier(role)))
