"""Read-only commands start no server; `db stop` returns once the server has exited (issue 26).

`gpuaas status` in a fresh state dir used to initialise and start an
embedded PostgreSQL and leave it running. Now status, history (both forms),
drift and usage exit 1 with `db.not_running` and the command that starts
one; `plan --offline` never touches a database at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from reconciler import settings
from reconciler.store import embedded

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(pg_server: embedded.Server) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gpuaas-ro-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root / "state"
    finally:
        embedded.destroy(embedded.server_for(root / "state"))
        shutil.rmtree(root, ignore_errors=True)


def gpuaas(state: Path, *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != settings.ENV_URL}
    env[settings.ENV_STATE_DIR] = str(state)
    return subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *argv],
        cwd=cwd,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _state(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    fields = _state(pid)
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie has exited


def _children(pid: int) -> list[int]:
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and (f := _state(int(p.name))) is not None and int(f[2]) == pid
    ]


@pytest.mark.parametrize(
    "argv", [("status",), ("history",), ("history", "--allocation", "alloc-0001"), ("drift",), ("usage",)], ids="-".join
)
def test_a_read_only_command_starts_no_server_and_says_how(state_dir: Path, argv: tuple[str, ...]) -> None:
    done = gpuaas(state_dir, *argv)
    assert done.returncode == 1, done
    assert "error: db.not_running:" in done.stderr and "gpuaas db start" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    server = embedded.server_for(state_dir)
    assert server.pid() is None and not server.initialized  # nothing initialised, nothing left running


def test_plan_offline_touches_no_database(state_dir: Path, tmp_path: Path) -> None:
    repo = tmp_path / "fleet"
    shutil.copytree(ROOT / "examples" / "fleet", repo)
    with git.Repo.init(repo, initial_branch="main") as r:
        r.git.add("-A")
        r.git.commit("-m", "base", "--author", "op <op@example.com>")
    done = gpuaas(state_dir, "plan", "--offline", cwd=repo)
    assert done.returncode in (0, 2), done.stderr
    assert not embedded.server_for(state_dir).initialized


def test_db_stop_returns_once_every_server_process_has_exited(state_dir: Path) -> None:
    started = gpuaas(state_dir, "db", "start")
    assert started.returncode == 0, started.stderr
    server = embedded.server_for(state_dir)
    pid = server.pid()
    assert pid is not None
    processes = [pid, *_children(pid)]
    assert len(processes) > 1  # checkpointer, background writer, ...
    stopped = gpuaas(state_dir, "db", "stop")
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped", stopped
    assert [p for p in processes if _alive(p)] == []
    assert gpuaas(state_dir, "db", "status").returncode == 3
    assert gpuaas(state_dir, "db", "stop").stdout.strip() == "not running"
