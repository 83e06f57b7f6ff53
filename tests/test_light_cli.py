"""Building the `gpuaas` parser and `--help` of CI's commands load no heavy library.

`gpuaas validate` in CI and `gpuaas host run` on a GPU host must not pay for
the graph library, git, libvirt, netlink or the database driver; each command
imports what it needs when it runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("networkx", "git", "libvirt", "pyroute2", "psycopg")

_PROBE = """
import json, sys
from reconciler import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {heavy})))
"""


@pytest.mark.parametrize("argv", [["--help"], ["validate", "--help"], ["plan", "--help"], ["host", "--help"]])
def test_help_imports_no_heavy_library(argv: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=set(HEAVY)), *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == [], f"gpuaas {' '.join(argv)} imported {loaded}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The check above can fail: a command that does import one is caught."""
    probe = "import networkx\n" + _PROBE.format(heavy=set(HEAVY))
    out = subprocess.run(
        [sys.executable, "-c", probe, "--help"], capture_output=True, text=True, check=True, timeout=60
    )
    assert "networkx" in json.loads(out.stdout.strip().splitlines()[-1])


def test_a_command_line_without_typos_imports_no_suggestions() -> None:
    """difflib ("did you mean") is imported once a word is wrong, not on every start of a plan."""
    probe = _PROBE.format(heavy={"difflib"})
    ok = subprocess.run(
        [sys.executable, "-c", probe, "plan", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert json.loads(ok.stdout.strip().splitlines()[-1]) == []
    typo = subprocess.run(
        [sys.executable, "-c", probe, "plna"], capture_output=True, text=True, timeout=60, check=False
    )
    assert "did you mean 'plan'" in typo.stderr and json.loads(typo.stdout.strip().splitlines()[-1]) == ["difflib"]
