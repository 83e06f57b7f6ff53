"""The wheel: built without warnings, holding its templates, SQL and the example fleet `gpuaas demo` runs on.

Built in a temp copy of the tree (`pip wheel --no-deps --no-build-isolation`, the venv's setuptools), so the
checkout gets no build/ or egg-info; the installed layout is the wheel unpacked, imported from a directory
with no examples/ in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    src = tmp_path_factory.mktemp("src")
    files = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_symlink():
            target.symlink_to(os.readlink(ROOT / name))
        elif (ROOT / name).is_file():
            shutil.copy2(ROOT / name, target)
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = dist.glob("*.whl")
    return built, done.stdout + done.stderr


def test_the_wheel_builds_without_warnings(wheel: tuple[Path, str]) -> None:
    _, log = wheel
    assert "Warning" not in log and "warning:" not in log.lower(), log


def test_the_wheel_holds_templates_sql_and_the_example_fleet(wheel: tuple[Path, str]) -> None:
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    assert "reconciler/service/templates/base.html" in names
    assert "schemas/sql/0001_inventory.sql" in names
    assert "schemas/sql/functions/gpuaas_place_batch.sql" in names  # migrations include it
    shipped = {
        n.removeprefix("reconciler/demo/example-fleet/")
        for n in names
        if n.startswith("reconciler/demo/example-fleet/")
    }
    example = {p.relative_to(ROOT / "examples/fleet").as_posix() for p in (ROOT / "examples/fleet").rglob("*.yaml")}
    assert shipped == example


def test_the_demo_finds_its_fleet_when_installed(wheel: tuple[Path, str], tmp_path: Path) -> None:
    site, elsewhere = tmp_path / "site", tmp_path / "cwd"
    zipfile.ZipFile(wheel[0]).extractall(site)
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import reconciler; from reconciler.commands import demo; "
        "print(reconciler.__file__); print(demo.example_fleet())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == str(site / "reconciler/demo/example-fleet")
    valid = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "validate", out[1]],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert valid.returncode == 0 and "valid: 28 files, 8 nodes" in valid.stdout, valid.stderr
