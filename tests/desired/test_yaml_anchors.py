"""Anchors: defined once per document, as PyYAML requires; a second definition is refused with a stable code."""

from __future__ import annotations

import pytest
import yaml

from desired import problems as p
from desired.reading import yamlio

CASES = [
    ("two scalars", "a: &x 1\nb: &x 2\n", (2, 4)),
    ("scalar then mapping", "a: &x 1\nb: &x {c: 1}\n", (2, 4)),
    ("mapping then sequence", "a: &x {c: 1}\nb: &x [1]\n", (2, 4)),
    ("inside the node it names", "a: &x\n  b: &x 1\n", (2, 6)),
    ("a key's anchor", "&x a: 1\nb: &x 2\n", (2, 4)),
    ("after an alias used it", "a: &x 1\nb: *x\nc: &x 3\n", (3, 4)),
]
FINE = [
    ("distinct anchors", "a: &x 1\nb: &y 2\nc: *x\n"),
    ("the same name in the next document", "a: &x 1\n---\nb: &x 2\n"),
    ("an alias used twice", "a: &x [1]\nb: *x\nc: *x\n"),
]


def _read(text: str) -> list[object]:
    return [d.value for d in yamlio.read_documents("f.yaml", text.encode())]


@pytest.mark.parametrize(("text", "where"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_duplicate_anchor_is_refused_where_it_is_defined_again(text: str, where: tuple[int, int]) -> None:
    with pytest.raises(yamlio.YamlProblem) as e:
        _read(text)
    assert (e.value.code, (e.value.line, e.value.column)) == (p.YAML_DUPLICATE_ANCHOR, where)
    assert e.value.message.startswith("anchor &x is defined twice")
    with pytest.raises(yaml.composer.ComposerError, match="duplicate anchor"):  # PyYAML agrees
        list(yaml.safe_load_all(text))


@pytest.mark.parametrize("text", [c[1] for c in FINE], ids=[c[0] for c in FINE])
def test_anchors_defined_once_read_as_pyyaml_reads_them(text: str) -> None:
    assert _read(text) == list(yaml.safe_load_all(text))
