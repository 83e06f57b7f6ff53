"""Every stable error code is declared once, in its layer's codes module, and documented.

The scan reads the product's source (AST): wherever a code is meant (a `code=` argument, a
`code = ...` class attribute, a `{"code": ...}` entry, a comparison with `.code`, a module-level
code constant, the code argument of a refusal helper, a literal inside a `raise`), the value must be
declared in a codes module and referenced through it, not written inline.
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from tests import errorcodes

ROOT = errorcodes.ROOT
# Every product package: import-linter's root packages (a package added later is scanned too).
PACKAGES = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"])
CODE_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)+$")
CODES_MODULES = {m.replace(".", "/") + ".py" for m, _ in errorcodes.MODULES}
# helper name -> index of its positional code argument
CODE_ARGS = {"_refuse": 0, "_not_ready": 1, "_error": 1, "_failed": 0, "Ineligible": 0, "Refused": 0, "Problem": 0}
# Dotted names in code-like places that are not codes (file names, a WebSocket subprotocol).
NOT_CODES = {"gpuaas.conf", "gpuaas.console"}
FILE_SUFFIXES = {"conf", "iso", "json", "yaml", "yml", "sqlite3", "lock", "log", "pid", "html", "xml", "sql", "py"}

DECLARED = errorcodes.declared()
VALUES = {c.value for c in DECLARED}
NAMESPACES = {v.split(".", 1)[0] for v in VALUES}


def _sources() -> list[tuple[str, ast.Module]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in CODES_MODULES:
                out.append((rel, ast.parse(path.read_text(), rel)))
    return out


SOURCES = _sources()


def _code_shaped(node: ast.AST, *, any_namespace: bool = False) -> bool:
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE_RE.match(node.value)):
        return False
    return node.value not in NOT_CODES and (any_namespace or node.value.split(".", 1)[0] in NAMESPACES)


def _literal_sites(tree: ast.Module) -> list[ast.Constant]:
    """Code literals written where a code is meant."""
    found: list[ast.AST] = []
    top = {id(s) for s in tree.body}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            found += [k.value for k in n.keywords if k.arg == "code"]
            name = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
            idx = CODE_ARGS.get(name)
            if idx is not None and len(n.args) > idx:
                found.append(n.args[idx])
        elif isinstance(n, ast.Dict):
            found += [
                v for k, v in zip(n.keys, n.values, strict=True) if isinstance(k, ast.Constant) and k.value == "code"
            ]
        elif isinstance(n, ast.Compare):
            sides = [n.left, *n.comparators]
            if any(getattr(s, "attr", None) == "code" or getattr(s, "id", None) == "code" for s in sides):
                for s in sides:
                    found += list(s.elts) if isinstance(s, (ast.Tuple, ast.Set, ast.List)) else [s]
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if not names or n.value is None:
                continue
            if names[0] in ("code", "CODE", "_CODE"):
                found.append(n.value)
            elif id(n) in top and names[0].lstrip("_").isupper():
                value = n.value
                if isinstance(value, ast.Call) and value.args and getattr(value.func, "id", "") in ("frozenset", "set"):
                    value = value.args[0]
                # A collection is one of codes when every element is one (not a list of LIKE patterns).
                elts = list(value.elts) if isinstance(value, (ast.Tuple, ast.Set, ast.List)) else []
                elts += [v for v in value.values if v is not None] if isinstance(value, ast.Dict) else []
                if elts and all(_code_shaped(e) for e in elts):
                    found += elts
                elif isinstance(value, ast.Constant) and str(value.value).rsplit(".", 1)[-1] not in FILE_SUFFIXES:
                    found.append(value)
    for n in list(found):
        if isinstance(n, ast.IfExp):
            found += [n.body, n.orelse]
    return [n for n in found if isinstance(n, ast.Constant) and _code_shaped(n)]


def _raise_literals(tree: ast.Module) -> list[ast.Constant]:
    """Code-shaped literals anywhere inside a `raise` (messages may quote a file name: namespaces filter)."""
    return [
        c
        for r in ast.walk(tree)
        if isinstance(r, ast.Raise)
        for c in ast.walk(r)
        if isinstance(c, ast.Constant) and _code_shaped(c)
    ]


def test_every_code_used_is_declared() -> None:
    undeclared = [
        f"{rel}:{c.lineno}: {c.value!s}"
        for rel, tree in SOURCES
        for c in (*_literal_sites(tree), *_raise_literals(tree))
        if c.value not in VALUES
    ]
    assert not undeclared, "declare these in the layer's codes module:\n" + "\n".join(undeclared)


def test_call_sites_use_the_constants() -> None:
    inline = [f"{rel}:{c.lineno}: {c.value!s}" for rel, tree in SOURCES for c in _literal_sites(tree)]
    assert not inline, (
        "use the codes module's constant (python /work/wt/names_codemod.py . rewrites them):\n" + "\n".join(inline)
    )


def test_codes_are_unique_and_named_once() -> None:
    dup_values = [v for v, n in Counter(c.value for c in DECLARED).items() if n > 1]
    assert not dup_values, f"declared twice: {dup_values}"
    dup_names = [k for k, n in Counter((c.module, c.name) for c in DECLARED).items() if n > 1]
    assert not dup_names, f"one constant name bound twice: {dup_names}"
    bad = [c.value for c in DECLARED if not CODE_RE.match(c.value)]
    assert not bad, f"not a dotted code: {bad}"


def test_every_code_has_a_meaning_and_is_documented() -> None:
    missing = [f"{c.module}.{c.name}" for c in DECLARED if not c.meaning.strip()]
    assert not missing, f"write the one-line meaning above: {missing}"
    page = errorcodes.DOC.read_text()
    assert page == errorcodes.render(DECLARED), "docs/error-codes.md is stale: run python -m tests.errorcodes --write"
    for c in DECLARED:
        assert f"`{c.value}`" in page


def test_codes_modules_hold_nothing_but_codes() -> None:
    """A codes module imports nothing, so every layer (the pure ones too) can import it."""
    for rel in CODES_MODULES:
        tree = ast.parse((ROOT / rel).read_text())
        for stmt in tree.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                continue
            ok = isinstance(stmt, ast.Assign) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))
            assert ok, f'{rel}:{stmt.lineno}: only `NAME = "code"` lines belong here'


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ('raise X("m", code="host.disk.missing")', ["host.disk.missing"]),
        ('class E:\n    code = "db.error"', ["db.error"]),
        ('if e.code in ("db.error", "db.unavailable"):\n    pass', ["db.error", "db.unavailable"]),
        ('x = {"code": "serve.error", "event": "serve.listen.lost"}', ["serve.error"]),
        ('NAME = "gpuaas.conf"\nFILE = "blobs.sqlite3"\nlog.info("x", extra={"event": "host.pass"})', []),
        ('RACE = frozenset({"claim.slot_taken", "claim.node_overlap"})', ["claim.slot_taken", "claim.node_overlap"]),
        ('PATTERNS = ("host.pci.%", "host.kvm_missing")', []),
        ('_not_ready(checks, "ready.no_schema", "m")', ["ready.no_schema"]),
    ],
)
def test_the_scan_finds_codes_where_they_are_meant(source: str, found: list[str]) -> None:
    assert [c.value for c in _literal_sites(ast.parse(source))] == found


def test_the_page_lists_each_layer() -> None:
    page = Path(errorcodes.DOC).read_text()
    for module, title in errorcodes.MODULES:
        assert f"## {title}" in page and module.replace(".", "/") in page
