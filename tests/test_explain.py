"""`gpuaas explain KIND[.field]`: read from the JSON Schemas, agreeing with the models."""

from __future__ import annotations

import enum
import json
from typing import Any

import pydantic
import pytest

from desired import jsonschemas
from desired import models as m
from reconciler import cli
from reconciler.commands import explain
from schemas.errors import UsageError

SCHEMAS = jsonschemas.generate()


def _walk(path: str, depth: int = 0) -> list[dict[str, Any]]:
    """The explanation of `path` and of every field below it, a few levels down."""
    doc = explain.explain(SCHEMAS, path)
    found = [doc]
    if depth < 3:
        for f in doc.get("fields", []):
            found += _walk(f"{path}.{f['name']}", depth + 1)
    return found


@pytest.mark.parametrize("kind", sorted(m.KINDS))
def test_every_field_explains_itself(kind: str) -> None:
    docs = _walk(kind)
    assert len(docs) > 5
    for doc in docs:
        assert doc["type"] and doc["type"] != "any", doc
        assert doc["description"].strip(), f"{doc['kind']}.{doc['field']} has no description"


def _json_default(value: Any) -> Any:
    """The model's default as the schema writes it (enums by value, tuples as lists)."""
    return json.loads(json.dumps(value, default=lambda v: v.value if isinstance(v, enum.Enum) else str(v)))


@pytest.mark.parametrize("kind", sorted(m.KINDS))
def test_required_and_defaults_agree_with_the_model(kind: str) -> None:
    """The schema is generated from the model; explain must not lose or invent a requirement or default."""
    for name, info in m.KINDS[kind].model_fields.items():
        doc = explain.explain(SCHEMAS, f"{kind}.{info.alias or name}")
        assert doc["required"] is info.is_required(), name
        if not info.is_required() and info.default_factory is None and not isinstance(info.default, pydantic.BaseModel):
            assert doc["default"] == _json_default(info.default), name


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("Sku.capacity_shape", {"type": "string", "required": True, "allowed": ["baremetal", "gpu_slice"]}),
        ("Sku.currency", {"default": "USD", "allowed": ["USD", "EUR"], "required": False}),
        ("Sku.allowed_gpu_counts", {"type": "[]integer", "allowed": [1, 2, 4, 8]}),
        ("Sku.resource_profile.slice_vm_profiles", {"type": "map[string]VmProfile"}),
        (
            "sku.resource_profile.slice_vm_profiles.memory_mib",
            {"type": "integer", "required": True, "constraints": {"minimum": 512}},
        ),
        ("SlotMap.slots", {"type": "[]Slot", "required": True, "constraints": {"minItems": 1}}),
        ("SlotMap.slots.nvme_identity", {"type": "NvmeIdentity", "required": False, "default": None}),
        ("Node.os_disk", {"required": True}),
        ("Allocation.kind", {"allowed": ["Allocation"]}),
        ("Fleet.placement.workload_mix", {"type": "map[string]number"}),
    ],
)
def test_field_facts(path: str, expected: dict[str, Any]) -> None:
    doc = explain.explain(SCHEMAS, path)
    assert {k: doc.get(k) for k in expected} == expected


def test_an_object_lists_its_fields_with_required_marks() -> None:
    doc = explain.explain(SCHEMAS, "SlotMap.slots")
    fields = {f["name"]: f for f in doc["fields"]}
    assert fields["private_ip"]["required"] is True and fields["enabled"]["required"] is False
    assert fields["capacity_metadata"]["type"] == "CapacityMetadata"


@pytest.mark.parametrize(
    ("path", "code", "names"),
    [
        ("Slots", explain.UNKNOWN_KIND, ["SlotMap"]),
        ("Quota", explain.UNKNOWN_KIND, ["Allocation", "Sku"]),  # nothing close: every kind is listed
        ("SlotMap.slots.privat_ip", explain.UNKNOWN_FIELD, ["private_ip"]),
        ("Sku.capacity", explain.UNKNOWN_FIELD, ["capacity_shape"]),
        ("Sku.sku.length", explain.UNKNOWN_FIELD, ["Sku.sku is string"]),
    ],
)
def test_unknown_names_say_what_is_close(path: str, code: str, names: list[str]) -> None:
    with pytest.raises(UsageError) as e:
        explain.explain(SCHEMAS, path)
    assert e.value.code == code
    assert all(n in e.value.message for n in names), e.value.message


def test_cli_error_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "Sku.gpu_cuont"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: explain.unknown_field: ") and "gpu_count" in err and "Traceback" not in err


def test_cli_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "Sku.capacity_shape"]) == 0
    text = capsys.readouterr().out
    assert "FIELD:        capacity_shape" in text and "REQUIRED:     yes" in text
    assert "ALLOWED:      baremetal, gpu_slice" in text and "baremetal: one allocation" in text
    assert cli.main(["explain", "Sku.capacity_shape", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == explain.explain(SCHEMAS, "Sku.capacity_shape")


def test_no_kind_lists_the_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["explain", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["kinds"]
    assert sorted(k["kind"] for k in listed) == sorted(m.KINDS)
    assert all(k["description"] and not k["description"].startswith("Always") for k in listed)
