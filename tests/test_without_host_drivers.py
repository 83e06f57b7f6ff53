"""The control plane runs without the host drivers: libvirt-python and pyroute2 are the `[host]` extra.

Each check runs in a fresh interpreter whose first act is a meta-path finder
that refuses `libvirt` and `pyroute2`, as on a control-plane machine that
installed the product without `[host]`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_BLOCK = """
import sys

class _NoHostDrivers:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"libvirt", "libvirtmod", "libvirtmod_qemu", "pyroute2"}:
            raise ModuleNotFoundError(f"No module named {name!r} (the [host] extra is not installed)", name=name)
        return None

sys.meta_path.insert(0, _NoHostDrivers())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK + code], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )


def test_help_and_validate_run_without_libvirt_and_pyroute2() -> None:
    helped = _run("from reconciler import cli\nsys.exit(cli.main(['--help']))")
    assert helped.returncode == 0 and "validate" in helped.stdout, helped.stderr
    valid = _run("from reconciler import cli\nsys.exit(cli.main(['validate', 'examples/fleet']))")
    assert valid.returncode == 0 and "valid: 28 files" in valid.stdout, valid.stderr


def test_the_service_app_and_every_control_plane_module_import_without_them() -> None:
    code = """
import importlib, pkgutil
import desired, policies, reconciler, schemas
from reconciler.service import asgi, server
failed = []
for package in (desired, policies, reconciler, schemas):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except ImportError as e:
            failed.append(f"{info.name}: {e}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
    done = _run(code)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_host_agent_without_them_says_which_extra_to_install(tmp_path: Path) -> None:
    argv = ["host", "converge", "--node", "n1", "--plan-file", str(tmp_path / "plan.json")]
    done = _run(f"from reconciler import cli\nsys.exit(cli.main({argv!r}))")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "error: host.drivers_missing:" in done.stderr and "gpuaas-reconciler[host]" in done.stderr


def test_the_blocker_refuses_the_host_drivers() -> None:
    """The checks above can fail: the host agent's libvirt driver does not import under the blocker."""
    done = _run("import host_reconciler.drivers.libvirt_driver")
    assert done.returncode != 0 and "the [host] extra is not installed" in done.stderr
    done = _run("import host_reconciler.drivers.network")
    assert done.returncode != 0 and "the [host] extra is not installed" in done.stderr
