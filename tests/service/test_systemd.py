"""The systemd units under deploy/systemd: hardened, and clean under `systemd-analyze verify`.

verify needs each ExecStart binary to exist, so the units are checked with
their install path (/usr/local/bin/gpuaas) replaced by this checkout's
gpuaas. verify exits 0 on an unknown key or a bad value and only warns, so
the test also requires it to print nothing, and proves on a mangled copy
that it would have noticed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED = "/usr/local/bin/gpuaas"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (Debian: systemd)")
COMMANDS = {
    "gpuaas-reconciler.service": " run ",
    "gpuaas-serve.service": " serve ",
    "gpuaas-host.service": " host run ",
}


def _settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(paths: list[Path]) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, "verify", *map(str, paths)], capture_output=True, text=True, timeout=120, check=False
    )


def _local_copies(tmp_path: Path, mangle: bool = False) -> list[Path]:
    gpuaas = Path(sys.executable).parent / "gpuaas"
    out = []
    for unit in sorted(UNITS.glob("*.service")):
        text = unit.read_text().replace(INSTALLED, str(gpuaas))
        if mangle:
            text = text.replace("NoNewPrivileges=yes", "NoNewPrivilegs=yes")
        target = tmp_path / unit.name
        target.write_text(text)
        out.append(target)
    return out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_units_are_hardened(name: str) -> None:
    s = _settings((UNITS / name).read_text())
    assert s["NoNewPrivileges"] == ["yes"] and s["ProtectSystem"] == ["strict"] and s["ReadWritePaths"]
    assert s["Restart"] == ["on-failure"] and s["EnvironmentFile"] and s["ProtectHome"] == ["yes"]
    assert s["ExecStart"][0].startswith(INSTALLED + " ") and COMMANDS[name] in s["ExecStart"][0] + " "
    if name != "gpuaas-host.service":  # the host agent needs root's device and network powers
        assert s["User"] == ["gpuaas"] and s["CapabilityBoundingSet"] == [""] and s["PrivateDevices"] == ["yes"]


@needs_analyze
def test_systemd_analyze_verify_passes_cleanly(tmp_path: Path) -> None:
    if not (Path(sys.executable).parent / "gpuaas").exists():
        pytest.skip("the gpuaas console script is not installed in this environment")
    done = _verify(_local_copies(tmp_path))
    assert done.returncode == 0 and done.stderr.strip() == "" and done.stdout.strip() == "", done.stderr
    mangled = tmp_path / "mangled"
    mangled.mkdir()
    bad = _verify(_local_copies(mangled, mangle=True))
    assert "Unknown key 'NoNewPrivilegs'" in bad.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_units_cap_tasks_filter_calls_and_narrow_writes(name: str) -> None:
    s = _settings((UNITS / name).read_text())
    assert s["TasksMax"] and int(s["TasksMax"][0]) <= 1024
    assert s["SystemCallFilter"][0].split()[0] == "@system-service" and s["SystemCallErrorNumber"] == ["EPERM"]
    assert s["ProtectHome"] == ["yes"]
    if name == "gpuaas-host.service":  # its state and image cache only: never all of /run or /var/lib/gpuaas
        writable = set(" ".join(s["ReadWritePaths"]).split())
        assert not {"/run", "-/run", "/var/lib/gpuaas", "-/var/lib/gpuaas", "-/var/lib/libvirt"} & writable


# Exposure (systemd-analyze security, 0 best .. 10 worst) each unit must stay at or under: the host
# agent keeps root's device and network powers, the two central services run as a plain user.
EXPOSURE = {"gpuaas-host.service": 6.0, "gpuaas-reconciler.service": 2.0, "gpuaas-serve.service": 2.0}


@needs_analyze
@pytest.mark.parametrize("name", sorted(EXPOSURE))
def test_exposure_stays_low(name: str) -> None:
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "security", "--offline=yes", str(UNITS / name)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    line = next((x for x in done.stdout.splitlines() if "Overall exposure level" in x), None)
    if line is None:
        pytest.skip(f"this systemd-analyze has no offline security check: {done.stderr.strip()[:200]}")
    score = float(line.split(":")[1].split()[0])
    assert score <= EXPOSURE[name], line
