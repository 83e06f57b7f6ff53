"""Project-wide rules a reviewer would otherwise have to remember."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
PACKAGES = ("desired", "policies", "reconciler", "host_reconciler", "schemas")
PURE = ("desired", "policies")
DRIVERS = {"psycopg", "libvirt", "pyroute2", "subprocess"}


def _sources(*packages: str) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def test_no_shell_true_or_os_system_anywhere() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for path in _sources(*PACKAGES, "tests", "examples")
        if re.search(r"shell\s*=\s*True|os\.system\(", path.read_text()) and path != Path(__file__)
    ]
    assert offenders == []


def test_pure_layers_import_no_driver() -> None:
    """desired/ and policies/ import no psycopg, libvirt, pyroute2 or subprocess (import-linter checks this too)."""
    offenders = []
    for path in _sources(*PURE):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in DRIVERS]
    assert offenders == []


def test_every_package_says_what_it_is_for() -> None:
    for pkg in PACKAGES:
        doc = ast.get_docstring(ast.parse((ROOT / pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 40, pkg
