"""Catalog rules of issue 11 on the example fleet: where an image comes from, and retired images.

The example fleet validates; each case edits one file of it and expects exactly the problems named,
at the line of the field that breaks the rule.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from desired.reading import loading, safefiles
from policies import validation

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet"
IMAGE = "images/h200-ubuntu-24.04-gpuaas-slice.yaml"
ALLOC = "allocations/alloc-0001.yaml"  # requested_at: 2026-11-20T09:00:00Z, image h200-ubuntu-24.04-gpuaas-slice


def problems(edits: dict[str, tuple[str, str]]) -> list[tuple[str, int, str]]:
    files = []
    for name, data in safefiles.iter_directory(FLEET):
        if name in edits:
            old, new = edits[name]
            text = data.decode()
            assert old in text, (name, old)
            files.append((name, text.replace(old, new).encode()))
        else:
            files.append((name, data))
    result = validation.validate(loading.parse_files(sorted(files)))
    return [(p.file, p.line, p.code) for p in result.errors]


def line_of(name: str, prefix: str) -> int:
    lines = (FLEET / name).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.startswith(prefix))


def test_the_example_fleet_is_valid() -> None:
    assert problems({}) == []


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("source_type: http\nsource_ref: https://images.example.net/h200/2026.10.1.qcow2", True),
        ("source_type: http\nsource_ref: http://10.0.0.5:8080/img.qcow2", True),
        ("source_type: http\nsource_ref: images/h200.qcow2", False),
        ("source_type: http\nsource_ref: ftp://images.example.net/x.qcow2", False),
        ("source_type: http\nsource_ref: https:///no-host.qcow2", False),
        ("source_type: file\nsource_ref: file:///srv/lab/images/h200.qcow2", True),
        ("source_type: file\nsource_ref: /srv/lab/images/h200.qcow2", False),
        ("source_type: file\nsource_ref: file:///srv/../etc/shadow", False),
        ("source_type: platform_storage\nsource_ref: images/h200/2026.10.1.qcow2", True),
        ("source_type: platform_storage\nsource_ref: /images/h200.qcow2", False),
        ("source_type: platform_storage\nsource_ref: images/../../etc/passwd", False),
        ("source_type: platform_storage\nsource_ref: https://elsewhere.example/x.qcow2", False),
    ],
)
def test_source_ref_must_match_its_source_type(source: str, ok: bool) -> None:
    old = "source_type: platform_storage\nsource_ref: images/h200-ubuntu-24.04-gpuaas-slice/2026.10.1.qcow2"
    got = problems({IMAGE: (old, source)})
    assert got == ([] if ok else [(IMAGE, line_of(IMAGE, "source_ref:"), "desired.image.source_ref")])


def test_a_retired_image_needs_its_date() -> None:
    got = problems({IMAGE: ("default_username: ubuntu", "default_username: ubuntu\nactive: false")})
    assert got == [(IMAGE, line_of(IMAGE, "default_username:") + 1, "desired.image.inactive_since")]


@pytest.mark.parametrize(
    ("since", "refused"),
    [
        ("2026-11-20T09:00:01Z", False),  # requested before: a running allocation keeps its image
        ("2026-11-20T09:00:00Z", True),  # requested at or after: a new request is refused
        ("2026-11-01T00:00:00Z", True),
    ],
)
def test_new_allocations_cannot_request_a_retired_image(since: str, refused: bool) -> None:
    retire = ("default_username: ubuntu", f"default_username: ubuntu\nactive: false\ninactive_since: {since}")
    got = problems({IMAGE: retire})
    expected = [(ALLOC, line_of(ALLOC, "image:"), "desired.allocation.image_inactive")] if refused else []
    assert [g for g in got if g[0] == ALLOC] == expected
    assert {code for _f, _l, code in got} <= {"desired.allocation.image_inactive"}  # no other rule fires


def test_a_released_allocation_is_never_refused_for_its_image() -> None:
    retire = "default_username: ubuntu\nactive: false\ninactive_since: 2026-01-01T00:00:00Z"
    got = problems({IMAGE: ("default_username: ubuntu", retire), ALLOC: ("state: present", "state: released")})
    assert (ALLOC, line_of(ALLOC, "image:"), "desired.allocation.image_inactive") not in got
