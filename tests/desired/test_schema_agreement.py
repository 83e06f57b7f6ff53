"""The committed JSON Schemas agree with `gpuaas validate` on every single-document rule they can state.

The example documents are mutated one field at a time (a wrong type, an
empty or malformed string, an address that is no address, a date that is no
date, a value out of range, a field deleted, an unknown field added), a
deterministic sample is drawn, and for each mutation:

- validate: the mutated document goes back into examples/fleet as YAML and
  the whole tree is validated; its verdict is whether the mutated file has a
  single-document problem (YAML, header, field, and the single-document
  rules of policies.validation). Cross-file rules (references, duplicates
  across files or slots, addresses inside a subnet) are not the schema's job.
- schema: the committed `schemas/<Kind>.schema.json` (what editors load) on
  the document as an editor sees it (YAML 1.2: a timestamp is a string),
  with format checking on.

Mutations refused only by a rule relating two values (INEXPRESSIBLE) are
left out of the comparison: JSON Schema cannot say "the gateway is inside the
subnet" or "the default profile is a key of slice_vm_profiles".
Issue 17 measured 44 disagreements in 1,500 mutations; this harness counted
373 in all 6,478 comparable mutations before the fix, 0 after.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from desired import jsonschemas
from desired import problems as p
from desired.reading import loading, safefiles, yamlio
from policies import validation
from reconciler.caches.blobs import BlobCache

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fleet"
SAMPLE = 600
SEED = 17

SINGLE_DOCUMENT = (
    "desired.yaml.",
    "desired.document.",
    "desired.field.",
    p.SKU_GPU_COUNTS,
    p.SKU_PROFILE,
    p.IMAGE_DIGEST,
    p.NODE_PROFILE_TAGS,
)
INEXPRESSIBLE = (
    (p.FIELD_VALUE, r"is outside subnet|is after dhcp_range|has host bits set"),
    (p.SKU_PROFILE, r"is not in slice_vm_profiles|is not a profile of this SKU"),
)

STRINGS = (
    "",
    "x" * 70,
    "Upper Case",
    "not an ip",
    "10.0.0.256",
    "10.100.0.0/33",
    "10.100.0.0",
    "::1",
    "2026-11-20",
    "2026-11-20T09:00:00",
    "2026-13-20T09:00:00Z",
    "2026-11-20T09:05:00Z",
    "0000:zz:00.0",
    "a b",
    "gpuaas-profile-other",
    5,
    None,
)
INTEGERS = (-1, 0, 3, 9, 100000, 1.5, True, None)


class Timestamp(str):
    """A timestamp as a person writes it, unquoted (`requested_at: 2026-11-20T09:00:00Z`)."""

    __slots__ = ()


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(Timestamp, lambda d, v: d.represent_scalar("tag:yaml.org,2002:timestamp", str(v)))


def _editor_view(value: Any) -> Any:
    """The document as YAML 1.2 (an editor) reads it: a timestamp is a string."""
    if isinstance(value, dict):
        return {k: _editor_view(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_editor_view(v) for v in value]
    if isinstance(value, dt.datetime):
        return Timestamp(value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return value


@dataclass(frozen=True, slots=True)
class Mutation:
    file: str
    index: int  # document in the file
    what: str
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind") or "")


def _documents() -> dict[str, list[dict[str, Any]]]:
    return {
        name: [_editor_view(d.value) for d in yamlio.read_documents(name, data)]
        for name, data in safefiles.iter_directory(EXAMPLE)
        if isinstance(data, bytes)
    }


def _candidates(value: Any) -> tuple[Any, ...]:  # noqa: PLR0911 - one return per value type reads best
    if isinstance(value, bool):
        return ("true", 0, None)
    if isinstance(value, int):
        return (*INTEGERS, str(value))
    if isinstance(value, float):
        return (-1.0, 0, "1.0", None)
    if isinstance(value, str):
        return STRINGS
    if isinstance(value, list):
        twice = [value[0], value[0]] if value and not isinstance(value[0], dict | list) else []
        return ([], None, "x", twice)
    if isinstance(value, dict):
        return ({}, None, "x")
    return ("x",)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):  # the first item of a list of mappings (slots) stands for the rest
        for i, v in enumerate(value[:1] if value and isinstance(value[0], dict) else value[:2]):
            yield from _leaves(v, (*path, i))


def _set(doc: dict[str, Any], path: tuple[Any, ...], value: Any, *, delete: bool = False) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    target: Any = out
    for part in path[:-1]:
        target = target[part]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


def mutations(files: dict[str, list[dict[str, Any]]]) -> list[Mutation]:
    out = []
    for name, docs in sorted(files.items()):
        for i, doc in enumerate(docs):
            out.append(Mutation(name, i, "unknown field", {**doc, "zz_unknown": 1}))
            for path, value in _leaves(doc):
                if not path or path[-1] in ("apiVersion", "kind"):
                    continue
                out += [Mutation(name, i, f"{path}={c!r}", _set(doc, path, c)) for c in _candidates(value)]
                if isinstance(path[-1], str):
                    out.append(Mutation(name, i, f"del {path}", _set(doc, path, None, delete=True)))
                if isinstance(value, dict):
                    out.append(Mutation(name, i, f"{path} + unknown", _set(doc, path, {**value, "zz_unknown": 1})))
    return out


class Verdicts:
    def __init__(self) -> None:
        self.files = _documents()
        self.raw = {name: (EXAMPLE / name).read_bytes() for name in self.files}
        self.cache = BlobCache()
        checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
        self.schemas = {
            kind: jsonschema.Draft202012Validator(
                json.loads((ROOT / "schemas" / jsonschemas.filename(kind)).read_text()), format_checker=checker
            )
            for kind in jsonschemas.generate()
        }

    def validate(self, mut: Mutation) -> tuple[bool | None, list[str]]:
        """True/False: validate accepts/refuses on a single-document rule; None: refused only by a relation."""
        docs = list(self.files[mut.file])
        docs[mut.index] = mut.doc
        text = yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False).encode()
        tree = [(n, text if n == mut.file else self.raw[n]) for n in sorted(self.files)]
        result = validation.validate(loading.parse_files(tree, cache=self.cache))
        found = [x for x in result.errors if x.file == mut.file and x.code.startswith(SINGLE_DOCUMENT)]
        stated = [x for x in found if not any(x.code == c and re.search(rx, x.message) for c, rx in INEXPRESSIBLE)]
        if found and not stated:
            return None, [x.render() for x in found]
        return not stated, [x.render() for x in stated]

    def schema(self, mut: Mutation) -> tuple[bool, list[str]]:
        errors = list(self.schemas[self.files[mut.file][mut.index]["kind"]].iter_errors(mut.doc))
        return not errors, [e.message for e in errors[:2]]


@pytest.fixture(scope="module")
def verdicts() -> Verdicts:
    return Verdicts()


def test_the_example_documents_are_valid_both_ways(verdicts: Verdicts) -> None:
    for name, docs in verdicts.files.items():
        for i, doc in enumerate(docs):
            mut = Mutation(name, i, "unchanged", doc)
            assert verdicts.validate(mut) == (True, []), name
            assert verdicts.schema(mut) == (True, []), name


def test_schema_and_validate_agree_on_single_field_mutations(verdicts: Verdicts) -> None:
    every = mutations(verdicts.files)
    sample = random.Random(SEED).sample(every, SAMPLE)  # noqa: S311 - a reproducible sample, not a secret
    disagreements, compared, refused = [], 0, 0
    for mut in sample:
        valid, problems = verdicts.validate(mut)
        if valid is None:
            continue
        compared += 1
        refused += not valid
        schema_ok, messages = verdicts.schema(mut)
        if schema_ok != valid:
            disagreements.append(
                f"{mut.file} {mut.what}: validate {'accepts' if valid else 'refuses'} "
                f"{problems[:1]}, schema {'accepts' if schema_ok else 'refuses'} {messages}"
            )
    assert len(every) > 5000 and compared > SAMPLE * 0.95
    assert refused > compared // 2  # the sample exercises refusals, not just harmless edits
    assert {m.kind for m in sample} == {"Fleet", "Sku", "Image", "Node", "SlotMap", "Allocation"}
    assert disagreements == []


@pytest.mark.parametrize(
    ("file", "path", "value", "accepted"),
    [
        ("slotmaps/h200-use1-s01.yaml", ("slots", 0, "private_ip"), "10.100.0.300", False),
        ("slotmaps/h200-use1-s01.yaml", ("slots", 0, "private_ip"), "fd00::10", True),
        ("fleet.yaml", ("management_network", "subnet"), "10.100.0.0/40", False),
        ("fleet.yaml", ("management_network", "gateway"), "gateway", False),
        ("fleet.yaml", ("management_network", "dhcp_range", "end"), "10.100.0.999", False),
        ("allocations/alloc-0001.yaml", ("requested_at",), "2026-11-20T09:05:00Z", True),  # quoted: accepted
        ("allocations/alloc-0001.yaml", ("requested_at",), "2026-11-20 09:05:00+02:00", True),
        ("allocations/alloc-0001.yaml", ("requested_at",), "20 Nov 2026", False),
        ("allocations/alloc-0001.yaml", ("requested_at",), "2026-11-20", False),
        ("skus/h200-sxm-baremetal-8g.yaml", ("exclusive_node",), False, False),
        ("skus/h200-sxm-slice.yaml", ("allowed_gpu_counts",), [], False),
        ("skus/h200-sxm-slice.yaml", ("allowed_gpu_counts",), [1, 3], False),
        ("skus/h200-sxm-slice.yaml", ("exclusive_node",), True, False),
        ("images/h200-ubuntu-24.04-gpuaas-slice.yaml", ("digest_sha256",), "ABC", False),
        ("nodes/h200-use1-s01.yaml", ("profile_tags",), ["gpuaas-profile-slice-vm", "gpuaas-profile-baremetal"], False),
        ("allocations/alloc-0001.yaml", ("id",), "a" * 57, False),  # its VM name would not be a DNS label
    ],
)
def test_the_rules_issue_17_named(
    verdicts: Verdicts, file: str, path: tuple[Any, ...], value: Any, accepted: bool
) -> None:
    mut = Mutation(file, 0, f"{path}={value!r}", _set(verdicts.files[file][0], path, value))
    assert verdicts.validate(mut)[0] is accepted
    assert verdicts.schema(mut)[0] is accepted


def test_a_baremetal_sku_without_exclusive_node_is_refused_with_the_rule(verdicts: Verdicts) -> None:
    file = "skus/h200-sxm-baremetal-8g.yaml"
    doc = _set(verdicts.files[file][0], ("exclusive_node",), None, delete=True)
    valid, problems = verdicts.validate(Mutation(file, 0, "no exclusive_node", doc))
    assert not valid and "a baremetal SKU must set exclusive_node: true" in problems[0]
    assert not verdicts.schema(Mutation(file, 0, "no exclusive_node", doc))[0]


def test_every_field_has_a_description_and_no_description_is_stale() -> None:
    missing, models = [], set()
    for kind, schema in jsonschemas.generate().items():
        for name, sub in [(kind, schema), *schema.get("$defs", {}).items()]:
            models.add(name)
            for field_name, prop in sub.get("properties", {}).items():
                if not str(prop.get("description", "")).strip():
                    missing.append(f"{name}.{field_name}")
    assert missing == []
    generated = {
        name: set(sub.get("properties", {}))
        for kind, schema in jsonschemas.generate().items()
        for name, sub in [(kind, schema), *schema.get("$defs", {}).items()]
    }
    stale = [
        f"{model}.{f}"
        for model, texts in jsonschemas.DESCRIPTIONS.items()
        for f in texts
        if f not in generated.get(model, set())
    ]
    assert stale == []
    assert sum(len(v) for v in generated.values()) >= 146
