"""The embedded database works from any directory, also one the `postgres` user cannot reach (issue 16).

/tmp/xyz (0700, as `mktemp -d` makes it)
  fleet/            a copy of examples/fleet; `gpuaas apply .` runs here
    .gpuaas/        the state dir: root only, so the cluster lives under
<embedded root>/<sha256(state dir)[:16]>/pg    (0755 down to it)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler import settings
from reconciler.store import embedded

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
ROOT = Path(__file__).resolve().parents[2]

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the postgres-user path only exists as root")


@pytest.fixture
def embedded_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gpuaas-embedded-", dir="/tmp"))
    root.chmod(0o755)
    monkeypatch.setenv(settings.ENV_EMBEDDED_ROOT, str(root / "embedded"))
    try:
        yield root / "embedded"
    finally:
        for pg in (root / "embedded").glob("*/pg"):
            embedded.destroy(embedded.Server(pg))
        shutil.rmtree(root, ignore_errors=True)


@as_root
def test_an_unreachable_state_dir_gets_its_server_under_the_embedded_root(tmp_path: Path, embedded_root: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    state = private / "repo" / ".gpuaas"
    digest = hashlib.sha256(str(state).encode()).hexdigest()[:16]
    assert embedded.server_for(state).root == embedded_root / digest / "pg"
    assert embedded.server_for(state) == embedded.server_for(state)  # the same checkout finds the same server
    reachable = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        reachable.chmod(0o755)
        assert embedded.server_for(reachable / ".gpuaas").root == reachable / ".gpuaas" / "pg"
    finally:
        reachable.rmdir()


def test_the_default_embedded_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.ENV_EMBEDDED_ROOT, raising=False)
    assert embedded.embedded_root() == Path("/var/lib/gpuaas/embedded")


@as_root
def test_apply_and_status_in_a_repo_under_a_private_directory(embedded_root: Path) -> None:
    try:
        embedded.bin_dir()
    except embedded.EmbeddedError as e:
        pytest.skip(f"no PostgreSQL server binaries: {e.message}")
    private = Path(tempfile.mkdtemp(dir="/tmp"))  # 0700, like `mktemp -d`
    try:
        assert private.stat().st_mode & 0o777 == 0o700
        repo = private / "fleet"
        shutil.copytree(EXAMPLE, repo)
        env = {k: v for k, v in os.environ.items() if k not in (settings.ENV_URL, settings.ENV_STATE_DIR)}
        env["PYTHONPATH"] = str(ROOT)

        def gpuaas(*argv: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "reconciler.cli", *argv],
                cwd=repo,
                env=env,
                check=False,
                capture_output=True,
                text=True,
                timeout=240,
            )

        applied = gpuaas("apply", ".")
        assert applied.returncode == 0, applied.stderr
        assert "placed:" in applied.stdout and "alloc-0001" in applied.stdout
        status = gpuaas("status")
        assert status.returncode == 0, status.stderr
        assert "alloc-0001" in status.stdout
        where = gpuaas("db", "status")
        assert where.returncode == 0 and str(embedded_root) in where.stdout
        assert not (repo / ".gpuaas" / "pg" / "data").exists()
        assert gpuaas("db", "stop").returncode == 0
    finally:
        shutil.rmtree(private, ignore_errors=True)
