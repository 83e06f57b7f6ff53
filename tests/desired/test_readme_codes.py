"""Every problem code the reader and the validator can report is listed in the README's code table."""

from __future__ import annotations

import re
from pathlib import Path

from desired import problems as p

ROOT = Path(__file__).resolve().parents[2]


def readme_codes() -> set[str]:
    """Codes of the README table; `.x` after a full code abbreviates the same prefix."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| code | meaning |") :]
    table = table[: table.index("\n\n")]
    found: set[str] = set()
    for row in table.splitlines()[2:]:
        prefix = ""
        for token in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if token.startswith("."):
                found.add(prefix + token[1:])
            elif token.startswith("desired."):
                found.add(token)
                prefix = token.rsplit(".", 1)[0] + "."
    return found


def emitted_codes() -> set[str]:
    """Codes of desired/problems.py that some module of desired/ or policies/ reports."""
    sources = "".join(
        f.read_text() for d in ("desired", "policies") for f in (ROOT / d).rglob("*.py") if f.name != "problems.py"
    )
    return {
        value
        for name, value in vars(p).items()
        if name.isupper()
        and isinstance(value, str)
        and value.startswith("desired.")
        and re.search(rf"\bp\.{name}\b", sources)
    }


def test_every_emitted_code_is_in_the_readme() -> None:
    codes = emitted_codes()
    assert {"desired.yaml.key_not_string", "desired.yaml.duplicate_anchor", "desired.field.value"} <= codes
    assert sorted(codes - readme_codes()) == []


def test_the_readme_lists_no_code_that_does_not_exist() -> None:
    known = {v for k, v in vars(p).items() if k.isupper() and isinstance(v, str)}
    assert sorted(readme_codes() - known) == []
