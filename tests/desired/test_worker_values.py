"""A parse worker sends plain values, never pydantic's pickling of its models (issue 31).

The worker validates every document (once); the parent makes the same
models again from their validated fields, and every problem keeps its
file, line and column.
"""

from __future__ import annotations

from multiprocessing import reduction
from pathlib import Path

import pytest

from desired import problems as p
from desired.reading import modelfields, parsepool
from desired.reading.documents import parse_one
from desired.reading.safefiles import UnreadFile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples/fleet"


def _chunk() -> list[tuple[str, bytes | UnreadFile]]:
    files: list[tuple[str, bytes | UnreadFile]] = [
        (str(path.relative_to(EXAMPLES)), path.read_bytes()) for path in sorted(EXAMPLES.rglob("*.yaml"))
    ]
    files.append(("nodes/bad-field.yaml", b"apiVersion: gpuaas.io/v1alpha1\nkind: Sku\nsku: x\nnope: 1\n"))
    files.append(("nodes/bad-yaml.yaml", b"apiVersion: gpuaas.io/v1alpha1\nkind: Image\nslug: [\n"))
    files.append(("nodes/unread.yaml", UnreadFile("desired.file.too_large", "too large")))
    return files


@pytest.mark.parametrize("values", [False, True])
def test_the_parent_gets_what_one_process_parses(values: bool) -> None:
    files = _chunk()
    sent = reduction.ForkingPickler.dumps(parsepool._parse_chunk(files, True, values, None))  # as the pipe does
    got = parsepool._unpacked(files, reduction.ForkingPickler.loads(sent), None, None)
    for (name, data), (typed, found, packed) in zip(files, got, strict=True):
        want_typed, want_found = parse_one(name, data, values)
        assert found == want_found
        assert [(t.index, t.line, t.value, t.problems) for t in typed] == [
            (t.index, t.line, t.value, t.problems) for t in want_typed
        ]
        assert [(type(t.model), t.model) for t in typed] == [(type(t.model), t.model) for t in want_typed]
        assert (packed is None) == (not isinstance(data, bytes))
    by_file = {x.file: x for _, found, _ in got for x in found}
    by_file.update({x.file: x for typed, _, _ in got for t in typed for x in t.problems})
    assert (by_file["nodes/bad-field.yaml"].code, by_file["nodes/bad-field.yaml"].line) == (p.FIELD_UNKNOWN, 4)
    assert by_file["nodes/bad-yaml.yaml"].line >= 3
    assert by_file["nodes/unread.yaml"].code == "desired.file.too_large"


def test_no_pydantic_pickling_crosses_the_pipe() -> None:
    sent = bytes(reduction.ForkingPickler.dumps(parsepool._parse_chunk(_chunk(), True, False, None)))
    assert b"__pydantic_fields_set__" not in sent  # pydantic's own state dict, one per model
    assert b"Typed" not in sent and b"Problem" not in sent  # nor the reader's dataclasses


def test_only_a_desired_state_model_is_made_from_sent_fields() -> None:
    with pytest.raises(TypeError):
        modelfields.rebuild(dict, {}, set())
