"""`-o yaml` wherever `-o json` exists, printing the same data (schemas/output.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler import cli
from schemas import output

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleet"


def _output_options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """(command path, choices) of every -o/--output option in the parser tree."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _output_options(sub, (*path, name))
        elif {"-o", "--output"} & set(action.option_strings) and action.choices is not None:
            found.append((" ".join(path), tuple(action.choices)))
    return found


def test_every_output_option_offering_json_offers_yaml() -> None:
    options = _output_options(cli.build_parser())
    with_json = {cmd for cmd, choices in options if "json" in choices}
    # The walk reaches nested commands of both agents; an empty walk would pass vacuously.
    assert {
        "validate",
        "plan",
        "history",
        "db check",
        "host converge",
        "host image list",
        "host gate",
        "explain",
    } <= with_json
    assert [cmd for cmd, choices in options if "json" in choices and "yaml" not in choices] == []


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(argv)
    return code, capsys.readouterr().out


def _same_data(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    json_code, json_out = _run([*argv, "-o", "json"], capsys)
    yaml_code, yaml_out = _run([*argv, "-o", "yaml"], capsys)
    assert json_code == yaml_code
    data = json.loads(json_out)
    assert not yaml_out.lstrip().startswith("{")  # YAML proper, not JSON (which YAML would also read)
    assert yaml.safe_load(yaml_out) == data
    return data


@pytest.mark.parametrize(
    "argv",
    [
        ["validate", str(FLEET)],
        ["validate", str(FLEET), "--summary"],
        ["plan", str(FLEET), "--offline"],
        ["explain", "Sku"],
        ["explain", "SlotMap.slots.nvme_identity"],
    ],
)
def test_yaml_is_the_json_data(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    data = _same_data(argv, capsys)
    assert data  # something was printed


def test_host_image_list_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _same_data(["host", "image", "list", "--cache", str(tmp_path)], capsys)
    assert data["cache"] == str(tmp_path) and data["images"] == []


def test_store_commands_yaml(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Commands reading the database: the invariants, the fleet status, history, drift, usage."""
    assert _same_data(["db", "check", "--db-url", db_url], capsys)["ok"] is True
    assert "nodes" in _same_data(["status", "--db-url", db_url], capsys)
    assert _same_data(["history", "--db-url", db_url], capsys) == []
    assert _same_data(["drift", "--db-url", db_url], capsys) == {"nodes": [], "total": 0}
    window = ["--from", "2026-11-01T00:00:00Z", "--to", "2026-11-02T00:00:00Z"]  # fixed: the default ends now
    assert "allocations" in json.dumps(_same_data(["usage", *window, "--db-url", db_url], capsys))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"at": "2026-11-20T09:05:00Z", "n": 1}, "at: '2026-11-20T09:05:00Z'\nn: 1"),  # a timestamp stays a string
        ({"yes": "yes", "null": None}, "'yes': 'yes'\n'null': null"),
        ({"b": 1, "a": [1, 2]}, "b: 1\na:\n- 1\n- 2"),  # the JSON order, not sorted
        ("text", "text"),  # a scalar without YAML's document-end marker
    ],
)
def test_yaml_dump_keeps_json_meaning(value: Any, expected: str) -> None:
    assert output.dumps(value, "yaml") == expected
    assert yaml.safe_load(expected) == value


def test_stream_records() -> None:
    assert output.dumps({"a": 1}, "json", indent=None, stream=True) == '{"a": 1}'
    assert output.dumps({"a": 1}, "yaml", stream=True) == "---\na: 1"
