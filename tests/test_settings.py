"""The central reconciler's settings: the environment read in one module, flags first."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from reconciler import settings
from reconciler.store import connections

ROOT = Path(__file__).resolve().parents[1] / "reconciler"
# Reads of os.environ that are not settings: credentials a Fleet names by variable, a child's environment.
# Not settings: a provider's credential variable named in the Fleet; the environment handed on to git; the
# variables that point git at another repository (apply's dirty check then compares every file itself).
OTHER_READERS = {"providers/registry.py", "reconcile/requests.py", "commands/dirtytree.py"}
TOOLS = ("bench/", "demo/", "providers/lab/")


@pytest.mark.parametrize(
    ("environ", "url", "state_dir", "root", "pg_bin"),
    [
        ({}, None, Path(".gpuaas"), None, None),
        ({"GPUAAS_DATABASE_URL": "", "GPUAAS_STATE_DIR": "", "GPUAAS_PG_BIN": ""}, None, Path(".gpuaas"), None, None),
        (
            {
                "GPUAAS_DATABASE_URL": "postgresql://db/x",
                "GPUAAS_STATE_DIR": "/srv/state",
                "GPUAAS_EMBEDDED_ROOT": "/srv/embedded",
                "GPUAAS_PG_BIN": "/opt/pg/bin",
            },
            "postgresql://db/x",
            Path("/srv/state"),
            Path("/srv/embedded"),
            Path("/opt/pg/bin"),
        ),
    ],
)
def test_settings_from_an_environment(
    environ: dict[str, str], url: str | None, state_dir: Path, root: Path | None, pg_bin: Path | None
) -> None:
    got = settings.Settings.from_env(environ)
    assert (got.database_url, got.state_dir, got.embedded_root, got.pg_bin) == (url, state_dir, root, pg_bin)


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(settings.ENV_URL, "postgresql://from-env/x")
    monkeypatch.setenv(settings.ENV_STATE_DIR, str(tmp_path / "env"))
    assert connections.database_url("postgresql://from-flag/x") == "postgresql://from-flag/x"
    assert connections.database_url() == "postgresql://from-env/x"
    assert connections.state_dir(tmp_path / "flag") == tmp_path / "flag"
    assert connections.state_dir() == tmp_path / "env"


def test_no_other_central_module_reads_the_environment() -> None:
    readers = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "settings.py" or rel in OTHER_READERS or rel.startswith(TOOLS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and _is_os(node.value):
                readers.append(f"{rel}:{node.lineno}")
    assert readers == [], "read the environment through reconciler.settings"


def _is_os(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "os"
