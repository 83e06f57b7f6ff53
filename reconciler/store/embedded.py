"""A private PostgreSQL server under a state directory, for a laptop or CI.

With no GPUAAS_DATABASE_URL, `gpuaas` runs its own server from the system's
PostgreSQL binaries (Debian: /usr/lib/postgresql/<major>/bin) and reuses it
on later runs. Layout under the state dir (`.gpuaas/` by default):

    pg/data/        the cluster (owned by `postgres`, 0700)
    pg/run/         the unix socket (0700): only root and `postgres` can connect
    pg/server.log   the server log
    pg.lock         serialises start/stop between gpuaas processes

initdb refuses to run as root, so as root every server binary runs as the
`postgres` user through `runuser -u postgres --` (argv lists, never a shell).
The server listens on its unix socket only, so servers of several checkouts
or test sessions never fight over a TCP port; the socket falls back to a
short /tmp directory when the state dir path is too long for a socket name.

The `postgres` user must be able to walk down to the cluster. As root, a
state dir below a directory others cannot search (root's home, `mktemp -d`)
would be unreachable, so its server lives under
`/var/lib/gpuaas/embedded/<sha256 of the state dir path>/` instead
($GPUAAS_EMBEDDED_ROOT overrides that root): the same checkout always finds
the same server, and `gpuaas` works from any directory. A cluster already
initialised in the state dir itself stays where it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from reconciler import codes as reconciler_codes
from reconciler import settings
from schemas import codes as schemas_codes
from schemas.errors import PermanentError, TemporaryError

PORT = 5432
OWNER = "postgres"
DEFAULT_DB = "gpuaas"
_SOCKET_NAME_MAX = 107 - len(f"/.s.PGSQL.{PORT}")
_CONF = "gpuaas.conf"
DEFAULT_ROOT = Path("/var/lib/gpuaas/embedded")


class EmbeddedError(PermanentError):
    code = reconciler_codes.DB_EMBEDDED


@dataclass(frozen=True, slots=True)
class Server:
    """Paths of one embedded server; nothing here starts or touches it."""

    root: Path  # <state dir>/pg

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    @property
    def lock_file(self) -> Path:
        return self.root.parent / "pg.lock"

    @property
    def socket_dir(self) -> Path:
        preferred = self.root / "run"
        if len(str(preferred)) <= _SOCKET_NAME_MAX:
            return preferred
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        return Path("/tmp") / f"gpuaas-pg-{digest}"  # noqa: S108 - short socket path, 0700, owner-only

    @property
    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def url(self, dbname: str = DEFAULT_DB) -> str:
        return f"postgresql://{OWNER}@/{quote(dbname)}?host={quote(str(self.socket_dir), safe='')}&port={PORT}"

    def pid(self) -> int | None:
        """The postmaster's pid when it is running, else None."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid


@dataclass(frozen=True, slots=True)
class Status:
    state_dir: Path
    initialized: bool
    running: bool
    pid: int | None
    url: str
    data_dir: Path
    log_file: Path


def server_for(state_dir: Path) -> Server:
    """The server of a state dir: in it, or (root, unreachable by `postgres`) under the embedded root."""
    here = Path(os.path.abspath(state_dir))
    if os.geteuid() != 0 or _searchable(here) or (here / "pg" / "data" / "PG_VERSION").exists():
        return Server(here / "pg")
    digest = hashlib.sha256(str(here).encode()).hexdigest()[:16]
    return Server(embedded_root() / digest / "pg")


def embedded_root() -> Path:
    return settings.current().embedded_root or DEFAULT_ROOT


def _searchable(path: Path) -> bool:
    """Every existing directory from / down to `path` can be searched by other users."""
    return all(not p.exists() or bool(p.stat().st_mode & 0o001) for p in (path, *path.parents))


def bin_dir() -> Path:
    """The PostgreSQL server binaries: $GPUAAS_PG_BIN, else the newest Debian install."""
    override = settings.current().pg_bin
    if override is not None:
        return override
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).parent
    raise EmbeddedError(
        "no PostgreSQL server binaries found (apt-get install postgresql, "
        "or set GPUAAS_PG_BIN, or set GPUAAS_DATABASE_URL)",
        code=reconciler_codes.DB_EMBEDDED_NO_POSTGRES,
    )


def _as_owner() -> list[str]:
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return [runuser, "-u", OWNER, "--"]


def _owner_ids() -> tuple[int, int] | None:
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(OWNER)
    except KeyError as e:
        raise EmbeddedError(
            f"running as root needs a {OWNER!r} user to own the server", code=reconciler_codes.DB_EMBEDDED_NO_OWNER
        ) from e
    return entry.pw_uid, entry.pw_gid


def _run(argv: list[str], what: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EmbeddedError(f"{what}: {e}", code=reconciler_codes.DB_EMBEDDED_COMMAND) from e


def _own_dir(path: Path, ids: tuple[int, int] | None, mode: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if ids is not None:
        os.chown(path, *ids)
    path.chmod(mode)


def _check_reachable(path: Path) -> None:
    """As root, the `postgres` user must be able to walk down to the state dir."""
    if os.geteuid() != 0:
        return
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.stat().st_mode & 0o001:
            raise EmbeddedError(
                f"{parent} is not searchable by other users, so the {OWNER!r} user cannot reach "
                f"{path}; choose another --state-dir or chmod o+x {parent}",
                code=reconciler_codes.DB_EMBEDDED_STATE_DIR_UNREACHABLE,
            )


def _make_reachable(path: Path) -> None:
    """Create `path` and its missing parents searchable by others (0755): the embedded root's layout."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for p in reversed(missing):
        p.mkdir(exist_ok=True)
        p.chmod(0o755)


def _pg_ctl(server: Server, action: str, *options: str) -> subprocess.CompletedProcess[str]:
    argv = [*_as_owner(), str(bin_dir() / "pg_ctl"), "-D", str(server.data_dir), "-w", *options, action]
    return _run(argv, f"pg_ctl {action}")


@contextlib.contextmanager
def _locked(server: Server) -> Iterator[None]:
    if os.geteuid() == 0:
        _make_reachable(server.lock_file.parent)
    server.lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(server.lock_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _config(server: Server, *, durable: bool) -> str:
    lines = [
        "# written by gpuaas at every start; edit the data dir's postgresql.conf instead",
        "listen_addresses = ''",
        f"port = {PORT}",
        f"unix_socket_directories = '{server.socket_dir}'",
        "unix_socket_permissions = 0700",
        "max_connections = 200",
        "shared_buffers = 128MB",
        "max_wal_size = 2GB",
        "log_min_messages = warning",
        "log_line_prefix = '%m [%p] '",
    ]
    if not durable:
        # Throwaway test servers: durability buys nothing and costs seconds.
        lines += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
    return "\n".join(lines) + "\n"


def init(server: Server, *, durable: bool = True) -> bool:
    """initdb once; True when a new cluster was created."""
    if server.initialized:
        return False
    ids = _owner_ids()
    if ids is not None and not server.root.parent.exists():
        _make_reachable(server.root.parent)
    server.root.parent.mkdir(parents=True, exist_ok=True)
    _check_reachable(server.root.parent)
    _own_dir(server.root, ids, 0o700)
    argv = [
        *_as_owner(),
        str(bin_dir() / "initdb"),
        "-D",
        str(server.data_dir),
        "-U",
        OWNER,
        "--auth=trust",
        "--encoding=UTF8",
        "--no-locale",
        "--no-instructions",
    ]
    if not durable:
        argv.append("--no-sync")
    done = _run(argv, "initdb")
    if done.returncode != 0:
        raise EmbeddedError(
            f"initdb failed: {done.stderr.strip() or done.stdout.strip()}", code=reconciler_codes.DB_EMBEDDED_INITDB
        )
    conf = server.data_dir / "postgresql.conf"
    with conf.open("a") as fh:
        fh.write(f"\ninclude_if_exists = '{_CONF}'\n")
    (server.data_dir / ".gpuaas-durable").write_text("1\n" if durable else "0\n")
    return True


def _durable(server: Server) -> bool:
    marker = server.data_dir / ".gpuaas-durable"
    return not marker.exists() or marker.read_text().strip() != "0"


def _write_config(server: Server) -> None:
    durable = _durable(server)
    target = server.data_dir / _CONF
    target.write_text(_config(server, durable=durable))
    ids = _owner_ids()
    if ids is not None:
        os.chown(target, *ids)
    _own_dir(server.socket_dir, ids, 0o700)


def start(server: Server, *, durable: bool = True, dbname: str = DEFAULT_DB) -> Server:
    """Initialise if needed, start if not running, and make sure `dbname` exists."""
    with _locked(server):
        init(server, durable=durable)
        if server.pid() is not None and not (server.socket_dir / f".s.PGSQL.{PORT}").exists():
            # Running, but its socket is gone (a /tmp cleaner took the fallback dir): restart it.
            _pg_ctl(server, "stop", "-m", "fast")
        if server.pid() is None:
            _write_config(server)
            done = _pg_ctl(server, "start", "-l", str(server.log_file), "-t", "60")
            if done.returncode != 0:
                raise EmbeddedError(
                    f"server did not start: {done.stderr.strip() or done.stdout.strip()}; see {server.log_file}",
                    code=reconciler_codes.DB_EMBEDDED_START,
                )
        create_database(server, dbname)
    return server


STOP_WAIT_S = 120.0  # a shutdown checkpoint of a large store may take this long; past it, say so


def _alive(pid: int) -> bool:
    """A process that still runs (a zombie no parent reaps has exited: it holds no files, no port)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    """The postmaster's processes (checkpointer, walwriter, backends): they outlive it by a moment."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[-1].split()[2]) == pid:
                out.append(int(entry.name))
    return out


def stop(server: Server, *, mode: str = "fast", wait_s: float = STOP_WAIT_S) -> bool:
    """Stop the server and return once it has exited (postmaster and its processes); False when not running.

    `pg_ctl -w stop` returns when the pid file is gone, which the postmaster
    removes on its way out: its processes may still hold the data dir. So we
    wait for every one of them (`db.embedded.stop` when they outlive wait_s).
    """
    with _locked(server):
        pid = server.pid()
        if pid is None:
            return False
        processes = [pid, *_children(pid)]
        done = _pg_ctl(server, "stop", "-m", mode)
        if done.returncode != 0 and server.pid() is not None:
            raise EmbeddedError(f"server did not stop: {done.stderr.strip()}", code=reconciler_codes.DB_EMBEDDED_STOP)
        deadline = time.monotonic() + wait_s
        while any(_alive(p) for p in processes):
            if time.monotonic() > deadline:
                left = [p for p in processes if _alive(p)]
                raise EmbeddedError(
                    f"server processes {left} still run {wait_s:g}s after the stop; see {server.log_file}",
                    code=reconciler_codes.DB_EMBEDDED_STOP,
                )
            time.sleep(0.02)
        return True


def create_database(server: Server, dbname: str, *, template: str | None = None) -> bool:
    """CREATE DATABASE unless it exists; True when created."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone():
                    return False
                stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname))
                if template:
                    stmt = sql.SQL("{} TEMPLATE {}").format(stmt, sql.Identifier(template))
                conn.execute(stmt)
                return True
        except psycopg.OperationalError as e:
            # The server may still be finishing recovery right after pg_ctl -w returns.
            if time.monotonic() > deadline:
                raise TemporaryError(f"cannot reach the embedded server: {e}", code=schemas_codes.DB_UNAVAILABLE) from e
            time.sleep(0.2)
        except psycopg.Error as e:
            raise EmbeddedError(
                f"cannot create database {dbname!r}: {e}", code=reconciler_codes.DB_EMBEDDED_CREATEDB
            ) from e


def status(state_dir: Path) -> Status:
    server = server_for(state_dir)
    pid = server.pid()
    return Status(
        state_dir=Path(os.path.abspath(state_dir)),
        initialized=server.initialized,
        running=pid is not None,
        pid=pid,
        url=server.url(),
        data_dir=server.data_dir,
        log_file=server.log_file,
    )


def running(server: Server) -> bool:
    """Running and reachable: a postmaster and its socket."""
    return server.pid() is not None and (server.socket_dir / f".s.PGSQL.{PORT}").exists()


def ensure(state_dir: Path) -> Server:
    """The running server of this state dir (started on first use)."""
    server = server_for(state_dir)
    if running(server):
        return server
    return start(server)


def destroy(server: Server) -> None:
    """Stop immediately and delete everything (throwaway test servers)."""
    if server.pid() is not None:
        _pg_ctl(server, "stop", "-m", "immediate")
    shutil.rmtree(server.root, ignore_errors=True)
    if not str(server.socket_dir).startswith(str(server.root)):
        shutil.rmtree(server.socket_dir, ignore_errors=True)
