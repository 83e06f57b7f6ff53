"""Every host setting is documented, with its default, in docs/host-reconciler.md.

The table under "## Host settings" is parsed and compared with the
HostSettings model: a field added without a row, a row for a field that is
gone, or a default that changed on one side only fails here. Each documented
default is also fed back through `settings.from_dict`, so the table only
shows values the loader accepts.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from pathlib import Path
from typing import Any

import pytest

from host_reconciler import settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "host-reconciler.md"
# Model fields that are not keys of the settings file, and why.
NOT_KEYS = {
    "node": "given by --node NAME",
    "extra": "read by nothing; refused like any unknown key",
}
_ROW = re.compile(r"^\| `(?P<key>[a-z_0-9]+)` \| (?P<type>.+?) \| `(?P<default>[^`]*)` \| (?P<meaning>.+) \|$")


def documented() -> dict[str, dict[str, str]]:
    text = DOC.read_text()
    section = text.split("\n## Host settings\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, dict[str, str]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            match = _ROW.match(line)
            assert match, f"not a settings row (| `key` | type | `default` | meaning |): {line}"
            assert match["key"] not in rows, f"{match['key']} documented twice"
            rows[match["key"]] = match.groupdict()
    return rows


def _json(value: Any) -> Any:
    """A model default as the settings file spells it."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


def model_defaults() -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(settings.HostSettings):
        if f.name in NOT_KEYS:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = _json(f.default)
        else:
            assert f.default_factory is not dataclasses.MISSING, f"{f.name} has no default"
            out[f.name] = _json(f.default_factory())
    return out


def test_every_field_has_a_row_and_every_row_a_field() -> None:
    rows, fields = set(documented()), set(model_defaults())
    assert fields - rows == set(), "settings without a row in docs/host-reconciler.md"
    assert rows - fields == set(), "rows in docs/host-reconciler.md for settings that do not exist"
    assert set(NOT_KEYS) <= {f.name for f in dataclasses.fields(settings.HostSettings)}


def test_documented_defaults_are_the_model_defaults() -> None:
    rows = documented()
    defaults = model_defaults()
    wrong = {
        key: (row["default"], defaults[key])
        for key, row in rows.items()
        if key in defaults and json.loads(row["default"]) != defaults[key]
    }
    assert wrong == {}, "documented default -> model default"


@pytest.mark.parametrize("key", sorted(model_defaults()))
def test_the_loader_takes_the_documented_default(key: str) -> None:
    row = documented()[key]
    assert row["type"].strip() and len(row["meaning"].strip()) > 10
    value = json.loads(row["default"])
    loaded = settings.from_dict("n1", {key: value})
    assert loaded == settings.from_dict("n1", {})


def test_not_keys_are_refused_and_said_so() -> None:
    text = DOC.read_text()
    assert "`--node NAME`" in text and "`extra`" in text
    with pytest.raises(settings.SettingsError) as e:
        settings.from_dict("n1", {"extra": {}})
    assert e.value.code == "host.settings.unknown"


def test_the_module_docstring_example_names_every_key() -> None:
    assert settings.__doc__ is not None
    named = set(re.findall(r'^\s+"([a-z_0-9]+)":', settings.__doc__, re.MULTILINE))
    assert named == set(model_defaults())
