"""Shared pytest setup. Fixture plugins live in tests/fixtures/ and are listed here.

Every test is either `unit` (pure: values in, values out, no process, server,
device or repository of its own) or `integration` (against a real component:
PostgreSQL, a git repository, libvirt's test driver, loop devices, network
namespaces, dnsmasq, a browser). The split is made here from what a test
uses, so a new test lands on the right side without anyone remembering to
mark it: `pytest -m unit` runs the pure suite in seconds. A module that
starts git or a subprocess outside these fixtures says so with
`pytestmark = pytest.mark.integration`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins: list[str] = ["tests.fixtures.pg"]

# Fixtures that start or touch a real component (directly or through another fixture).
REAL_FIXTURES = frozenset(
    {
        "pg_server",
        "db_url",
        "empty_db_url",
        "conn",
        "fleet_url",
        "served",  # PostgreSQL, HTTP
        "fleet_repo",
        "loop",  # git repositories, the reconcile loop
        "loops",
        "netns",
        "lab",  # loop devices, network namespaces, lab hosts
        "trees",
        "tree_copy",
        "scratch",  # recorded sysfs trees built on disk
    }
)
# Folders whose tests all drive real components (hosts, networks, the service, the loop).
REAL_FOLDERS = ("tests/host/", "tests/hostnet/", "tests/service/", "tests/gitops/", "tests/claims/", "tests/baremetal/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path.as_posix()
        if item.get_closest_marker("integration") is not None:  # a module that says so itself
            continue
        real = (
            bool(REAL_FIXTURES.intersection(getattr(item, "fixturenames", ())))
            or any(f"/{folder}" in path for folder in REAL_FOLDERS)
            or item.get_closest_marker("root") is not None
            or item.get_closest_marker("slow") is not None
        )
        item.add_marker(pytest.mark.integration if real else pytest.mark.unit)


@pytest.fixture(autouse=True)
def _user_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The blob cache's default home (`${XDG_CACHE_HOME:-~/.cache}/gpuaas`) is a temp dir, never the user's."""
    if not os.environ.get("GPUAAS_STATE_DIR"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(Path(tmp_path_factory.getbasetemp()) / "xdg-cache"))
