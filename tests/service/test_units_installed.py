"""The units as shipped: installed by deploy/install.sh, they pass `systemd-analyze verify` unmodified; and the
notify protocol their `Type=notify` and `WatchdogSec=` rely on, received on a real unix datagram socket.

verify runs with `--root` on a tree holding the system's own units (sysinit.target and friends), what
install.sh put there and a stand-in for the venv at /opt/gpuaas: no line of a unit is rewritten for the test.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
ANALYZE = shutil.which("systemd-analyze")
SYSTEM_UNITS = Path("/usr/lib/systemd/system")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None or not SYSTEM_UNITS.is_dir(), reason="systemd-analyze is not installed (Debian: systemd)"
)


def _install(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(ROOT / "deploy" / "install.sh"), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _verify(root: Path) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, "verify", f"--root={root}", *(u.name for u in UNITS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def image(tmp_path: Path) -> Path:
    """A root tree with the system's units and an installed gpuaas at /opt/gpuaas/bin/gpuaas."""
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / "usr/lib/systemd/system", symlinks=True)
    venv = root / "opt/gpuaas/bin"
    venv.mkdir(parents=True)
    script = Path(sys.executable).parent / "gpuaas"
    (venv / "gpuaas").write_text(script.read_text() if script.exists() else "#!/bin/sh\n")
    (venv / "gpuaas").chmod(0o755)
    return root


@needs_analyze
def test_the_units_verify_exactly_as_shipped_once_installed(image: Path) -> None:
    (image / "etc/systemd/system").mkdir(parents=True)
    for unit in UNITS:  # the units alone, as the README's copy steps left them: the console script is missing
        shutil.copy(unit, image / "etc/systemd/system" / unit.name)
    before = _verify(image)
    assert before.returncode != 0 and "/usr/local/bin/gpuaas" in before.stderr  # what the install step fixes
    done = _install(image)
    assert done.returncode == 0, done.stderr
    for unit in UNITS:
        assert (image / "etc/systemd/system" / unit.name).read_bytes() == unit.read_bytes()  # as shipped
    checked = _verify(image)
    assert checked.returncode == 0 and checked.stdout.strip() == "" and checked.stderr.strip() == "", checked.stderr
    again = _install(image)  # idempotent; a configured environment file is kept
    assert again.returncode == 0 and (image / "etc/gpuaas/gpuaas.env").exists()


def test_every_documentation_link_is_installed(image: Path) -> None:
    assert _install(image).returncode == 0
    for unit in UNITS:
        docs = [
            w
            for line in unit.read_text().splitlines()
            if line.startswith("Documentation=")
            for w in line.removeprefix("Documentation=").split()
        ]
        assert docs, unit.name
        for url in docs:
            assert url.startswith("file:///usr/share/doc/gpuaas/"), url
            assert (image / url.removeprefix("file:///")).is_file(), url


def test_install_refuses_without_an_installed_gpuaas(tmp_path: Path) -> None:
    done = _install(tmp_path)
    assert done.returncode == 1 and "not an executable gpuaas" in done.stderr
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_units_are_notify_with_a_watchdog(unit: Path) -> None:
    lines = unit.read_text().splitlines()
    assert "Type=notify" in lines and any(line.startswith("WatchdogSec=") for line in lines)


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(path)
        s.settimeout(60)
        yield s, path


def test_serve_says_ready_pings_the_watchdog_and_says_stopping(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    env.pop("WATCHDOG_PID", None)
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--db-url",
            "postgresql://127.0.0.1:1/unreachable",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as proc:
        try:
            ready = sock.recv(4096).decode().splitlines()
            assert ready[0] == "READY=1" and ready[1].startswith("STATUS=serving on http://127.0.0.1:")
            assert sock.recv(4096) == b"WATCHDOG=1"  # its own /healthz answered
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        seen = []
        while not seen or seen[-1] == b"WATCHDOG=1":
            seen.append(sock.recv(4096))
        assert seen[-1] == b"STOPPING=1"


def test_without_a_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    from schemas import notify

    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify.notify("READY=1") is False
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", "1")  # another process's watchdog
    assert notify.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert notify.watchdog_interval() == 15.0
