"""The stable error codes, read from each layer's codes module, and docs/error-codes.md built from them.

`python -m tests.errorcodes --write` regenerates the page; tests/test_error_codes.py checks it is
current, that every code used is declared and that no two constants share a value.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "error-codes.md"

# One codes module per layer, lowest first: a code two layers use lives in one both may import.
MODULES = (
    ("schemas.codes", "Shared by both agents (schemas/)"),
    ("desired.codes", "Desired state (desired/)"),
    ("policies.codes", "Policies (policies/)"),
    ("reconciler.placement.codes", "Placement (reconciler/placement/)"),
    ("reconciler.codes", "Central reconciler (reconciler/)"),
    ("host_reconciler.codes", "Host agent (host_reconciler/)"),
)

_DECL = re.compile(r'^([A-Z][A-Z0-9_]*) = "([^"]+)"')


@dataclass(frozen=True)
class Code:
    module: str
    name: str
    value: str
    meaning: str


def declared() -> list[Code]:
    """Every constant of every codes module, with the comment line(s) above it as its meaning."""
    out: list[Code] = []
    for module, _title in MODULES:
        mod = importlib.import_module(module)
        path = Path(mod.__file__ or "")
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = _DECL.match(line)
            if not m:
                continue
            comment: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].startswith("# "):
                comment.insert(0, lines[j][2:].strip())
                j -= 1
            assert getattr(mod, m.group(1)) == m.group(2), (module, m.group(1))
            out.append(Code(module, m.group(1), m.group(2), " ".join(comment)))
    return out


def render(codes: list[Code] | None = None) -> str:
    codes = declared() if codes is None else codes
    parts = [
        "# Error codes",
        "",
        "Every error a user can see carries a stable dotted code, printed as `CODE: message` and in",
        "`-o json` output. Codes never change once set; this page is generated from the codes",
        "module of each layer (`python -m tests.errorcodes --write`) and a test keeps it current.",
        "",
    ]
    for module, title in MODULES:
        mine = sorted((c for c in codes if c.module == module), key=lambda c: c.value)
        path = module.replace(".", "/") + ".py"
        parts += [f"## {title}", "", f"Declared in `{path}`.", "", "| Code | Meaning |", "| --- | --- |"]
        parts += [f"| `{c.value}` | {c.meaning.replace('|', '/')} |" for c in mine]
        parts.append("")
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = render()
    if "--write" in argv:
        DOC.write_text(text)
        return 0
    current = DOC.read_text() if DOC.exists() else ""
    if current != text:
        print(f"{DOC} is stale: run python -m tests.errorcodes --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
