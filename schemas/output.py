"""`-o json` and `-o yaml`: one option, one printer, for every command of both agents.

kubectl habit: wherever a command prints JSON it prints the same data as YAML.
The YAML is not a second rendering of the command's objects but the JSON-ready
value itself, dumped by `yaml.safe_dump`: `yaml.safe_load(yaml) ==
json.loads(json)` holds for every command (tests/test_cli_output.py), so a
script can switch formats without noticing. Values JSON cannot hold
(datetimes, paths) become strings first, for both formats alike: times as ISO
8601 with a `T` (`2026-11-27T13:38:05+00:00`), as the HTTP API writes them, so
one parser reads both; anything else as `str()` makes it.

Lives in `schemas` because the host agent prints the same way and must not
import `reconciler`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

STRUCTURED = ("json", "yaml")


def add_argument(parser: argparse.ArgumentParser, *formats: str, default: str = "text") -> None:
    """`-o/--output` offering the command's own formats (text, markdown, csv...) and then json and yaml."""
    parser.add_argument(
        "-o", "--output", choices=(*formats, *STRUCTURED), default=default, help=f"output format (default: {default})"
    )


def structured(output: str) -> bool:
    """True for json and yaml: the command prints its data, not prose."""
    return output in STRUCTURED


def jsonable(value: Any) -> Any:
    """What `json.dumps` writes for a value it cannot hold: ISO 8601 for times, `str()` for the rest."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return str(value)


def dumps(value: Any, output: str, *, indent: int | None = 2, stream: bool = False) -> str:
    """`value` as JSON or YAML text without a trailing newline.

    `indent=None` keeps JSON on one line (commands whose JSON a script reads line by line);
    `stream=True` marks one record of many: a YAML document starts with `---`.
    """
    text = json.dumps(value, indent=indent, default=jsonable)
    if output == "json":
        return text
    if output != "yaml":
        raise ValueError(f"not a structured output: {output!r}")
    import yaml  # only the YAML printer pays for it

    doc = yaml.safe_dump(
        json.loads(text),
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        explicit_start=stream,
        width=4096,
    )
    return doc.removesuffix("\n").removesuffix("...").removesuffix("\n")


def emit(value: Any, output: str, *, indent: int | None = 2, stream: bool = False) -> None:
    """Print `value` in `output` (json or yaml) on stdout."""
    print(dumps(value, output, indent=indent, stream=stream), flush=stream)
