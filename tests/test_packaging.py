"""The wheels: the product's with its templates and SQL and no tool; the tools' with the example fleet.

Both built in a temp copy of the tree (`pip wheel --no-deps --no-build-isolation`, the venv's setuptools), so
the checkout gets no build/ or egg-info; the installed layout is the wheels unpacked, imported from a directory
with no examples/ in it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout's tracked and unignored files (links kept as links)."""
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
    return src


def _build(src: Path, dist: Path) -> tuple[Path, str]:
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


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The product's wheel, gpuaas-reconciler."""
    return _build(source, tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def tools_wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The tools' wheel, gpuaas-tools (tools/)."""
    return _build(source / "tools", tmp_path_factory.mktemp("tools-dist"))


def test_the_wheels_build_without_warnings(wheel: tuple[Path, str], tools_wheel: tuple[Path, str]) -> None:
    for _, log in (wheel, tools_wheel):
        assert "Warning" not in log and "warning:" not in log.lower(), log


def test_the_product_wheel_holds_templates_and_sql_and_no_tool(wheel: tuple[Path, str]) -> None:
    names = set(zipfile.ZipFile(wheel[0]).namelist())
    assert "reconciler/service/templates/base.html" in names
    assert "schemas/sql/0001_inventory.sql" in names
    assert "schemas/sql/functions/gpuaas_place_batch.sql" in names  # migrations include it
    tools = [n for n in names if re.search(r"(^|/)(bench|demo|lab|hostbench|gpuaas_tools)(/|\.py$)", n)]
    assert tools == []
    (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line for line in zipfile.ZipFile(wheel[0]).read(meta).decode().splitlines() if "Requires-Dist" in line]
    # The host drivers come only with the [host] extra: a control plane installs without them.
    assert [r for r in requires if ("libvirt" in r or "pyroute2" in r) and 'extra == "host"' not in r] == []


def test_the_tools_wheel_holds_the_example_fleet_and_the_command_entry_points(
    tools_wheel: tuple[Path, str],
) -> None:
    archive = zipfile.ZipFile(tools_wheel[0])
    names = set(archive.namelist())
    shipped = {
        n.removeprefix("gpuaas_tools/demo/example-fleet/")
        for n in names
        if n.startswith("gpuaas_tools/demo/example-fleet/")
    }
    example = {p.relative_to(ROOT / "examples/fleet").as_posix() for p in (ROOT / "examples/fleet").rglob("*.yaml")}
    assert shipped == example
    (points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = archive.read(points).decode()
    assert "[gpuaas.commands]" in text
    assert {"bench", "demo", "host.image.bench"} <= {line.split(" = ")[0] for line in text.splitlines()}


def test_the_demo_finds_its_fleet_when_installed(
    wheel: tuple[Path, str], tools_wheel: tuple[Path, str], tmp_path: Path
) -> None:
    site, elsewhere = tmp_path / "site", tmp_path / "cwd"
    zipfile.ZipFile(wheel[0]).extractall(site)
    zipfile.ZipFile(tools_wheel[0]).extractall(site)
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import reconciler; from gpuaas_tools.demo import command as demo; "
        "print(reconciler.__file__); print(demo.example_fleet())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert out[0].startswith(str(site)) and out[1] == str(site / "gpuaas_tools/demo/example-fleet")
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
