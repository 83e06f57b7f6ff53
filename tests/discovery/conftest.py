"""Recorded host trees for discovery tests, built once per session by examples/sysfs/build.py.

Tests that change a tree work on a copy (`tree_copy`), so the shared build
stays as recorded.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "examples" / "sysfs" / "build.py"
FLEET = REPO / "examples" / "fleet"
GOLDEN = Path(__file__).resolve().parent / "golden"
TREES = ("xe9680l-h200", "xe9680l-h200-shared-parent", "xe9680-mi300x-roce")
NODES = {
    "xe9680l-h200": "h200-use1-s01",
    "xe9680l-h200-shared-parent": "h200-use1-c01",
    "xe9680-mi300x-roce": "mi300x-euw1-r01",
}


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpuaas_sysfs_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where trees are built: tmpfs when there is one (a tree is ~1000 small files and
    this disk takes ~2 s to copy them; tmpfs ~0.15 s), else pytest's tmp dir."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        path = Path(tempfile.mkdtemp(prefix="gpuaas-discovery-", dir="/dev/shm"))
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("sysfs")


@pytest.fixture(scope="session")
def trees(scratch: Path) -> dict[str, Path]:
    build = load_build()
    roots = {}
    for host in build.hosts():
        build.build(host, scratch / "recorded" / host.dirname)
        roots[host.dirname] = scratch / "recorded" / host.dirname
    assert sorted(roots) == sorted(TREES)
    return roots


@pytest.fixture
def tree_copy(trees: dict[str, Path], scratch: Path) -> Iterator[Callable[[str], Path]]:
    work = Path(tempfile.mkdtemp(prefix="copy-", dir=scratch))

    def copy(name: str) -> Path:
        dest = work / name
        shutil.copytree(trees[name], dest, symlinks=True)
        return dest

    yield copy
    shutil.rmtree(work, ignore_errors=True)


def relink(root: Path, rel: str, target: Path) -> None:
    """Point the symlink at `rel` to `target`, spelled relative as the kernel does."""
    link = root / rel
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def move_pci_function(root: Path, old: str, new: str) -> None:
    """Renumber one PCI function in a tree the way a changed SR-IOV layout would show it."""
    root = Path(os.path.realpath(root))
    old_dir = Path(os.path.realpath(root / "sys/bus/pci/devices" / old))
    new_dir = old_dir.with_name(new)
    old_dir.rename(new_dir)
    (root / "sys/bus/pci/devices" / old).unlink()
    relink(root, f"sys/bus/pci/devices/{new}", new_dir)
    group = Path(os.path.realpath(new_dir / "iommu_group"))
    (group / "devices" / old).unlink()
    relink(root, str((group / "devices" / new).relative_to(root)), new_dir)
    driver = Path(os.path.realpath(new_dir / "driver"))
    (driver / old).unlink()
    relink(root, str((driver / new).relative_to(root)), new_dir)
    if (new_dir / "physfn").is_symlink():
        parent = Path(os.path.realpath(new_dir / "physfn"))
        for link in parent.iterdir():
            if link.name.startswith("virtfn") and os.readlink(link).endswith("/" + old):
                relink(root, str(link.relative_to(root)), new_dir)
