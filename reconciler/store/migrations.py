"""Versioned SQL migrations: schemas/sql/NNNN_name.sql, applied in order, once.

Each file runs in its own transaction and is recorded in schema_migrations
with a checksum; a recorded file that changed afterwards is an error, never
silently re-run. A session advisory lock keeps two processes from migrating
at once. Numbers up to 0081 were given out with gaps (0001-0049 the claims
store, later features 0050 and up); from 0082 on each migration takes the
next number.

The live body of a function that a migration changes is kept in
schemas/sql/functions/<name>.sql, and the migration re-applies it with a
line `\\ir functions/<name>.sql` (psql's include-relative, so a file also
runs under psql from schemas/sql). The checksum covers the migration as
written; the included text is read when the migration runs, and its checksum
is recorded in schema_function_files: a function file that changed after a
migration applied it, with no pending migration to re-apply it, is an error
(the databases already migrated would keep the old body).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from reconciler import codes as reconciler_codes
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.errors import PermanentError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_INCLUDE = re.compile(r"^\\ir\s+(\S+)\s*$")
_FUNCTION_FILE = re.compile(r"^functions/[a-z0-9_]+\.sql$")
_LOCK_KEY = 0x67707561_6173  # "gpuaas"


@dataclass(frozen=True, slots=True)
class Migration:
    version: str
    name: str
    source: str  # the file as written
    sql: str = ""  # what runs: `source` with its \\ir lines replaced by the files they name
    included: tuple[tuple[str, str], ...] = ()  # (functions/<name>.sql, checksum of its text) per \\ir line

    def __post_init__(self) -> None:
        if not self.sql:
            object.__setattr__(self, "sql", self.source)

    @property
    def file_name(self) -> str:
        return f"{self.version}_{self.name}.sql"

    @property
    def checksum(self) -> str:
        return _sha256(self.source)

    @property
    def includes(self) -> tuple[str, ...]:
        """The function files (`functions/<name>.sql`) this migration re-applies, in order."""
        return tuple(path for path, _ in self.included)


def sql_dir() -> Path:
    """schemas/sql: package data of `schemas` (checkout, editable or wheel install)."""
    return Path(str(resources.files("schemas") / "sql"))


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def expand(file_name: str, source: str, root: Path) -> tuple[str, tuple[tuple[str, str], ...]]:
    """`source` with each `\\ir functions/<name>.sql` line replaced by that file, and (file, checksum) of each.

    Any other line that starts with a backslash is an error.
    """
    out: list[str] = []
    included: list[tuple[str, str]] = []
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        if not line.startswith("\\"):
            out.append(line)
            continue
        match = _INCLUDE.match(line)
        target = match.group(1) if match else None
        if target is None or not _FUNCTION_FILE.match(target):
            raise PermanentError(
                f"{file_name}:{number}: a line that starts with a backslash must be"
                f" `\\ir functions/<name>.sql`, not {line.strip()!r}",
                code=reconciler_codes.DB_MIGRATION_INCLUDE,
            )
        path = root / target
        if not path.is_file():
            raise PermanentError(
                f"{file_name}:{number}: {target} does not exist", code=reconciler_codes.DB_MIGRATION_INCLUDE
            )
        body = path.read_text(encoding="utf-8")
        out.append(body if body.endswith("\n") else body + "\n")
        included.append((target, _sha256(body)))
    return "".join(out), tuple(included)


def available() -> list[Migration]:
    found = []
    root = sql_dir()
    for entry in sorted(root.iterdir()):
        match = _FILE.match(entry.name)
        if match:
            source = entry.read_text(encoding="utf-8")
            sql, included = expand(entry.name, source, root)
            found.append(Migration(match.group(1), match.group(2), source, sql, included))
    versions = [m.version for m in found]
    dupes = sorted({v for v in versions if versions.count(v) > 1})
    if dupes:
        raise PermanentError(
            f"two migrations share version(s) {', '.join(dupes)}", code=reconciler_codes.DB_MIGRATION_DUPLICATE
        )
    return sorted(found, key=lambda m: m.version)


def applied(conn: Connection) -> dict[str, str]:
    """version -> checksum of every recorded migration ({} on an empty database)."""
    with dberrors.wrapped("read schema_migrations"):
        exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return {}
        rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
    return {str(v): str(c) for v, c in rows}


def applied_functions(conn: Connection) -> dict[str, tuple[str, str]]:
    """functions/<name>.sql -> (checksum, version of the migration that last applied it)."""
    with dberrors.wrapped("read schema_function_files"):
        exists = conn.execute("SELECT to_regclass('schema_function_files') IS NOT NULL").fetchone()
        if not exists or not exists[0]:
            return {}
        rows = conn.execute("SELECT path, checksum, version FROM schema_function_files").fetchall()
    return {str(p): (str(c), str(v)) for p, c, v in rows}


def migrate(conn: Connection) -> list[str]:
    """Apply every pending migration; returns the versions applied (empty: nothing to do).

    Needs a connection outside a transaction; it is left in autocommit mode.
    """
    if not conn.autocommit:
        conn.commit()
        conn.autocommit = True
    todo = available()
    done = applied(conn)
    _check_unchanged(todo, done, applied_functions(conn))
    if all(m.version in done for m in todo):
        return []
    ran: list[str] = []
    with dberrors.wrapped("migrate"):
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            with conn.transaction():
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version text PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_function_files ("
                    " path text PRIMARY KEY, checksum text NOT NULL, version text NOT NULL)"
                )
            done = applied(conn)  # another process may have migrated while we waited
            _check_unchanged(todo, done, applied_functions(conn))
            for m in todo:
                if m.version in done:
                    continue
                with conn.transaction():
                    conn.execute(m.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (m.version, m.name, m.checksum),
                    )
                    for path, checksum in m.included:
                        conn.execute(
                            "INSERT INTO schema_function_files (path, checksum, version) VALUES (%s, %s, %s)"
                            " ON CONFLICT (path) DO UPDATE SET"
                            " checksum = EXCLUDED.checksum, version = EXCLUDED.version",
                            (path, checksum, m.version),
                        )
                ran.append(m.version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return ran


def _check_unchanged(todo: list[Migration], done: dict[str, str], functions: dict[str, tuple[str, str]]) -> None:
    for m in todo:
        if m.version in done and done[m.version] != m.checksum:
            raise PermanentError(
                f"migration {m.version}_{m.name}.sql changed after it was applied; "
                "add a new migration instead of editing an applied one",
                code=reconciler_codes.DB_MIGRATION_CHANGED,
            )
    now = {path: checksum for m in todo for path, checksum in m.included}
    reapplied = {path for m in todo if m.version not in done for path in m.includes}
    for path, (checksum, version) in sorted(functions.items()):
        if path in now and now[path] != checksum and path not in reapplied:
            raise PermanentError(
                f"{path} changed after migration {version} applied it; add a migration that"
                f" re-applies it (a line `\\ir {path}`), or the databases already migrated keep the old body",
                code=reconciler_codes.DB_MIGRATION_FUNCTION_CHANGED,
            )
