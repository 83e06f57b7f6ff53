"""The plain block-style reader gives exactly what libyaml's event path gives, or declines.

`desired.reading.blockstyle` reads most fleet files without libyaml. It may decline
any file (the event path reads it then), but a value it returns must equal
the event path's: the same keys in the same order, the same scalar types and
values under YAML 1.1, the same first line. Checked over random documents
built from scalars chosen to trip YAML 1.1's implicit typing, over the
example fleet and over a synthetic one.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from pathlib import Path
from typing import Any

import pytest

from desired.reading import blockstyle, yamlio

ROOT = Path(__file__).resolve().parents[2]

# Raw scalars as they would stand after "key: " or "- ". Many are typed by YAML 1.1's
# implicit resolvers (bools, octal, sexagesimal, timestamps); many must be declined.
SCALARS = [
    "h200",
    "yes",
    "No",
    "on",
    "OFF",
    "y",
    "n",
    "true",
    "False",
    "~",
    "null",
    "Null",
    "NULL",
    "0",
    "7",
    "010",
    "0o10",
    "0x1F",
    "0b101",
    "1_000",
    "+12",
    "-5",
    "-0",
    "1:30",
    "-1:30",
    "190:20:30",
    "1.5",
    ".5",
    "-.5",
    "1e3",
    "1.0e+3",
    "6.8523015e+5",
    ".inf",
    "-.Inf",
    ".NaN",
    "1_000.5",
    "0.",
    "1:30.5",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "2001-12-14 21:59:43.10",
    "2002-1-1",
    "2001-13-45",
    "52:54:00:00:00:00",
    "0000:1b:00.0",
    "10.100.0.10",
    "fe80::1",
    "/dev/disk/by-id/nvme-X_1",
    "a b c",
    "a:b",
    "a,b",
    "x-y_z",
    "tcp://h:80/p",
    "=",
    "<<",
    "0x",
    "1.2.3",
    "'52:54:00:00:00:00'",
    "'yes'",
    "'it''s'",
    "''",
    "' spaced '",
    "'a: b'",
    "'#x'",
    '"dq"',
    '""',
    '"a\\nb"',
    "'unterminated",
    '"a"b"',
    "it's",
    "a #b",
    "a: b",
    "a:",
    "&a x",
    "*a",
    "!str x",
    "!!int 3",
    "[1, 2]",
    "[]",
    "{}",
    "{a: 1}",
    "|",
    ">",
    "@x",
    "`x",
    "%x",
    "?x",
    ":x",
    "-x",
    "- x",
    "-",
    "#c",
    "a\\b",
    "caf\u00e9",
    "tab\there",
]
KEYS = ["name", "node", "on", "yes", "n", "y", "null", "key-with-dash", "_private", "a1", "slots", "x"]


def _events(text: str) -> list[yamlio.Document] | yamlio.YamlProblem:
    """The event path's documents (the reader libyaml drives), or its refusal."""
    try:
        return list(yamlio._build("f.yaml", text, text.encode()))
    except yamlio.YamlProblem as e:
        return e


def _same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 and True, 1 and 1.0 differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dt.datetime):
        return a == b and a.tzinfo == b.tzinfo
    return bool(a == b)


def _agrees(text: str) -> bool:
    """Check one text; True when the block reader took it."""
    fast = blockstyle.read(text)
    if fast is None:
        return False
    docs = _events(text)
    assert not isinstance(docs, yamlio.YamlProblem), f"the event path refuses what was read:\n{text}\n{docs.message}"
    assert len(docs) == 1, text
    assert _same(fast[0], docs[0].value), f"{text}\nblock: {fast[0]!r}\nevents: {docs[0].value!r}"
    assert fast[1] == docs[0].line, text
    return True


def _render(rng: random.Random, value: Any, indent: int, step: int, out: list[str]) -> None:
    """Block YAML for a random mapping, in one of the layouts people write."""
    pad = " " * indent
    for key, item in value.items():
        if isinstance(item, str):
            out.append(f"{pad}{key}:{' ' * rng.choice((1, 1, 1, 2))}{item}")
        elif isinstance(item, dict):
            out.append(f"{pad}{key}:")
            _render(rng, item, indent + step, step, out)
        else:
            out.append(f"{pad}{key}:")
            seq_pad = pad if rng.random() < 0.5 else " " * (indent + step)  # indentless or indented
            for element in item:
                dash = "-" + " " * rng.choice((1, 1, 3))
                if isinstance(element, str):
                    out.append(f"{seq_pad}{dash}{element}")
                else:
                    inner: list[str] = []
                    _render(rng, element, len(seq_pad) + len(dash), step, inner)
                    out.append(seq_pad + dash + inner[0].lstrip(" "))
                    out.extend(inner[1:])


def _random_mapping(rng: random.Random, depth: int, scalars: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(rng.randint(1, 5)):
        key = rng.choice(KEYS)
        roll = rng.random()
        if roll < 0.65 or depth > 2:
            out[key] = rng.choice(scalars)
        elif roll < 0.8:
            out[key] = _random_mapping(rng, depth + 1, scalars)
        else:
            out[key] = [
                rng.choice(scalars) if rng.random() < 0.4 else _random_mapping(rng, depth + 1, scalars)
                for _ in range(rng.randint(1, 3))
            ]
    return out


def _random_text(rng: random.Random) -> str:
    scalars = SCALARS if rng.random() < 0.5 else SCALARS[:60]  # half the files only mostly-accepted scalars
    lines: list[str] = []
    _render(rng, _random_mapping(rng, 0, scalars), 0, rng.choice((2, 2, 4)), lines)
    roll = rng.random()
    if roll < 0.05:
        lines.insert(rng.randrange(len(lines) + 1), "")
    elif roll < 0.08:
        lines.insert(rng.randrange(len(lines) + 1), "# a comment")
    elif roll < 0.10:
        lines.insert(0, "---")
    elif roll < 0.12:
        i = rng.randrange(len(lines))
        lines[i] += "  "  # trailing spaces
    elif roll < 0.14:
        i = rng.randrange(len(lines))
        lines.insert(i + 1, lines[i])  # a duplicate key, or a continued scalar
    elif roll < 0.16:
        lines.insert(0, "   ")
    return "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")


def test_random_documents_read_as_the_event_path_reads_them() -> None:
    rng = random.Random(20261125)  # noqa: S311 - test randomness
    taken = sum(_agrees(_random_text(rng)) for _ in range(3000))
    # Not a vacuous pass: most files are the block reader's (its declines are the rest).
    assert taken > 400


def test_every_scalar_alone_reads_as_the_event_path_reads_it() -> None:
    taken = 0
    for raw in SCALARS:
        for text in (f"k: {raw}\n", f"k:\n- {raw}\n", f"- a: 1\n  b: {raw}\n"):
            taken += _agrees(text)
    assert taken > 100


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\n# note\n",
        "a: &x 1\nb: *x\n",
        "a: !!str 1\n",
        "a: [1, 2]\n",
        "a: |\n  text\n",
        "a: one\n  two\n",
        "a: 1\na: 2\n",
        "a: caf\u00e9\n",
        "a: 1\r\nb: 2\r\n",
        "---\na: 1\n",
        "a: 1\n---\nb: 2\n",
        "a: 1\n...\n",
        "'a': 1\n",
        "? a\n: 1\n",
        "- - 1\n",
        "plain\n",
        "",
        "  a: 1\n",
        'a: "x\\ty"\n',
        "a: 1 # note\n",
        "a:  1\n",
    ],
)
def test_what_it_is_not_sure_of_goes_to_the_event_path(text: str) -> None:
    assert blockstyle.read(text) is None


def test_values_are_fresh_each_read() -> None:
    text = "a:\n  b: x\nc:\n- 1\n- 2\n"
    first = blockstyle.read(text)
    assert first is not None
    first[0]["a"]["b"] = "changed"
    first[0]["c"].append(3)
    again = blockstyle.read(text)
    assert again is not None
    assert again[0] == {"a": {"b": "x"}, "c": [1, 2]}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())


def test_the_example_fleet_reads_the_same() -> None:
    files = _files(ROOT / "examples")
    assert files
    for path in files:
        text = path.read_text()
        if blockstyle.read(text) is not None:
            _agrees(text)
        got = [d.value for d in yamlio.read_documents(path.name, path.read_bytes())]
        assert all(_same(x, y.value) for x, y in zip(got, _events(text), strict=True))  # type: ignore[arg-type]


def test_a_synthetic_fleet_is_read_by_the_block_reader(tmp_path: Path) -> None:
    from reconciler.commands import fleet
    from reconciler.placement import synthesis

    for f in synthesis.fleet_documents(12, amd_share=0.25, seed=3):
        fleet._dump(tmp_path / f.path, f.document)
    taken = {}
    for path in _files(tmp_path):
        text = path.read_text()
        taken[path.parent.name] = taken.get(path.parent.name, True) and _agrees(text)
    # Slot maps and nodes are nearly every file of a fleet: they must take the fast path.
    assert taken.get("slotmaps") and taken.get("nodes"), taken


def test_its_caches_stay_bounded() -> None:
    for i in range(blockstyle.MAX_SHAPES + 50):
        text = f"k{i}: v{i}\n"
        assert blockstyle.read(text) == ({f"k{i}": f"v{i}"}, 1)
        assert len(blockstyle._shapes) <= blockstyle.MAX_SHAPES
    long = "x" * (blockstyle.MAX_VALUE_CHARS + 1)
    assert blockstyle.read(f"k: {long}\n") == ({"k": long}, 1)
    assert long not in blockstyle._typed
