"""Migration files: numbered in order from 0082 on, and one file per live function body.

A function that a migration changes keeps its live body in
schemas/sql/functions/<name>.sql, which migrations re-apply with `\\ir`; these
tests hold the database to those files, and an upgraded database to a fresh one.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from reconciler.store import connections, migrations
from reconciler.store.connections import Connection
from schemas.errors import PermanentError

LAST_GAPPED = 81  # numbers up to here were given out with gaps; from 0082 on none
_CREATE = re.compile(r"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+([a-z0-9_]+)\s*\(", re.M | re.I)
_BODY = re.compile(r"\$\$(.*?)\$\$", re.S)
FUNCTIONS = migrations.sql_dir() / "functions"


def _function_files() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(FUNCTIONS.glob("*.sql"))}


def _functions(conn: Connection) -> dict[str, str]:
    """signature -> pg_get_functiondef of every function and procedure the migrations made."""
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid)"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p')"
        " AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')"
    ).fetchall()
    return {str(sig): str(body) for sig, body in rows}


def test_migration_numbers_are_unique_and_follow_on_from_0081() -> None:
    names = sorted(p.name for p in migrations.sql_dir().iterdir() if p.name[:1].isdigit())
    # A file the runner's pattern misses would never be applied, silently.
    assert all(re.fullmatch(r"\d{4}_[a-z0-9_]+\.sql", n) for n in names), names
    versions = [int(n[:4]) for n in names]
    assert len(versions) == len(set(versions)), [v for v, k in Counter(versions).items() if k > 1]
    newer = sorted(v for v in versions if v > LAST_GAPPED)
    assert newer == list(range(LAST_GAPPED + 1, LAST_GAPPED + 1 + len(newer))), newer
    assert [m.version for m in migrations.available()] == [n[:4] for n in names]


def test_a_function_changed_after_its_creation_has_one_file_that_migrations_include() -> None:
    files = _function_files()
    defined = Counter(name for m in migrations.available() for name in _CREATE.findall(m.source))
    redefined = {name for name, times in defined.items() if times > 1}
    assert redefined, "the pattern no longer finds the functions the migrations define"
    assert redefined <= set(files), redefined - set(files)
    for name, text in files.items():
        assert _CREATE.findall(text) == [name], f"functions/{name}.sql must define {name} and nothing else"
    included = {Path(f).stem for m in migrations.available() for f in m.includes}
    assert included == set(files), set(files) ^ included
    for m in migrations.available():
        if int(m.version) > LAST_GAPPED:  # from here on a function body lives in its file only
            assert not _CREATE.findall(m.source), f"{m.file_name} defines a function inline: use \\ir functions/"


def test_each_live_function_is_its_file(conn: Connection) -> None:
    live = _functions(conn)
    for name, text in _function_files().items():
        (body,) = [b for b in _BODY.findall(text)][:1]
        sources = [str(r[0]) for r in conn.execute("SELECT prosrc FROM pg_proc WHERE proname = %s", (name,)).fetchall()]
        assert sources == [body], f"the live {name} is not functions/{name}.sql (or it has overloads)"
        # Attributes too (volatility, cost, SET, defaults): applying the file again changes nothing.
        with conn.transaction(force_rollback=True):
            conn.execute(text.encode())
            assert _functions(conn) == live, f"functions/{name}.sql differs from the live {name}"


def test_a_database_migrated_by_the_files_before_0082_ends_with_the_functions_of_a_fresh_one(
    empty_db_url: str, conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = [m for m in migrations.available() if int(m.version) <= LAST_GAPPED]
    assert not any(m.includes for m in old)  # the files as they were: applied migrations never change
    with connections.connect(empty_db_url, autocommit=True) as upgraded:
        with monkeypatch.context() as patched:
            patched.setattr(migrations, "available", lambda: old)
            migrations.migrate(upgraded)
        before = _functions(upgraded)
        assert migrations.migrate(upgraded) == [m.version for m in migrations.available()][len(old) :]
        after = _functions(upgraded)
    assert after == _functions(conn)  # a fresh database (every migration at once)
    # The one function 0083 changes: gpuaas_place_batch took p_fault (its old signature is gone).
    # Functions that existed before (later migrations may add new ones).
    existed = {sig.split("(")[0] for sig in before}
    changed = {
        sig
        for sig in before.keys() | after.keys()
        if before.get(sig) != after.get(sig) and sig.split("(")[0] in existed
    }
    assert {sig.split("(")[0] for sig in changed} == {"gpuaas_place_batch"}, changed
    assert [sig for sig in after if sig.startswith("gpuaas_place_batch(")] == [
        "gpuaas_place_batch(text[],text[],jsonb[],text[],integer[],text[],text[],text,text,"
        "integer[],integer[],text[],text[],text[],text,text)"
    ]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("\\i functions/f.sql", "must be `\\ir functions/<name>.sql`"),
        ("\\ir ../0001_x.sql", "must be `\\ir functions/<name>.sql`"),
        ("\\ir functions/missing.sql", "functions/missing.sql does not exist"),
    ],
)
def test_an_include_the_runner_cannot_follow_names_the_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, says: str
) -> None:
    (tmp_path / "functions").mkdir()
    (tmp_path / "functions" / "f.sql").write_text("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;\n")
    (tmp_path / "0001_x.sql").write_text(f"-- x\n{line}\n")
    monkeypatch.setattr(migrations, "sql_dir", lambda: tmp_path)
    with pytest.raises(PermanentError) as info:
        migrations.available()
    assert info.value.code == "db.migration.include"
    assert str(info.value).startswith("0001_x.sql:2: ") and says in str(info.value)


def test_an_include_runs_the_file_and_the_checksum_covers_the_migration_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "functions").mkdir()
    body = "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;"
    (tmp_path / "functions" / "f.sql").write_text(body)
    (tmp_path / "0001_x.sql").write_text("-- x\n\\ir functions/f.sql\nSELECT f();\n")
    monkeypatch.setattr(migrations, "sql_dir", lambda: tmp_path)
    (m,) = migrations.available()
    assert m.sql == f"-- x\n{body}\nSELECT f();\n" and m.includes == ("functions/f.sql",)
    (tmp_path / "functions" / "f.sql").write_text(body.replace("1", "2"))
    (again,) = migrations.available()
    assert again.checksum == m.checksum and again.sql != m.sql


def test_a_function_file_changed_without_a_migration_to_reapply_it_is_refused(
    empty_db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "functions").mkdir()
    f = tmp_path / "functions" / "f.sql"
    f.write_text("CREATE OR REPLACE FUNCTION f() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;\n")
    (tmp_path / "0001_x.sql").write_text("\\ir functions/f.sql\n")
    monkeypatch.setattr(migrations, "sql_dir", lambda: tmp_path)
    with connections.connect(empty_db_url, autocommit=True) as conn:
        assert migrations.migrate(conn) == ["0001"]
        f.write_text(f.read_text().replace("SELECT 1", "SELECT 2"))
        with pytest.raises(PermanentError) as info:
            migrations.migrate(conn)  # this database would keep `SELECT 1` while a fresh one gets `SELECT 2`
        assert info.value.code == "db.migration.function_changed"
        assert "functions/f.sql changed after migration 0001 applied it" in str(info.value)
        (tmp_path / "0002_y.sql").write_text("-- f returns 2\n\\ir functions/f.sql\n")
        assert migrations.migrate(conn) == ["0002"]
        assert conn.execute("SELECT f()").fetchone() == (2,)
        assert migrations.applied_functions(conn)["functions/f.sql"][1] == "0002"
        assert migrations.migrate(conn) == []
