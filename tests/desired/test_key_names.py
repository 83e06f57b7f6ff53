"""Names that arrive as dict keys or references get the name rule too (models and committed JSON Schema).

VM profile names are the keys of `resource_profile.slice_vm_profiles`; they
reach claims, host plans, PR plans and dashboards, so a key such as
`<img src=//evil.invalid/p.png></details>` is refused like a bad node name.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from desired import models as m

SCHEMAS = Path(__file__).parent.parent.parent / "schemas"
PROFILE = {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 65536}
SKU: dict[str, Any] = {
    "apiVersion": m.API_VERSION,
    "kind": "Sku",
    "sku": "s1",
    "capacity_shape": "gpu_slice",
    "accelerator_vendor": "nvidia",
    "accelerator_model": "h200",
    "allowed_gpu_counts": [1],
    "network_fabric": "infiniband",
    "gpu_hourly_price_minor": 1,
    "resource_profile": {"default_slice_vm_profile": "p1", "slice_vm_profiles": {"p1": PROFILE}},
}
BAD = ["<img src=//evil.invalid/p.png></details>", "UPPER", "a|b", "-lead", "x" * 64, "", "a b", "p1\n"]


def _sku(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SKU)
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return doc


def _cases(bad: str) -> list[dict[str, Any]]:
    return [
        _sku(("resource_profile", "slice_vm_profiles"), {"p1": PROFILE, bad: PROFILE}),
        _sku(("resource_profile", "default_slice_vm_profile"), bad),
        _sku(("resource_profile", "slice_vm_profiles"), {"p1": {**PROFILE, "derived_from": bad}}),
        _sku(("resource_profile", "slice_vm_profiles"), {"p1": {**PROFILE, "guest_driver_profile": bad}}),
    ]


def test_the_good_document_passes() -> None:
    assert list(m.Sku.model_validate(SKU).resource_profile.slice_vm_profiles) == ["p1"]
    jsonschema.validate(SKU, json.loads((SCHEMAS / "Sku.schema.json").read_text()))


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_profile_name_is_refused_by_the_model_and_the_schema(bad: str) -> None:
    schema = json.loads((SCHEMAS / "Sku.schema.json").read_text())
    for doc in _cases(bad):
        with pytest.raises(ValidationError) as info:
            m.Sku.model_validate(doc)
        assert {e["type"] for e in info.value.errors()} == {"string_pattern_mismatch"}
        if not bad.endswith("\n"):  # Python's re (the jsonschema package) lets `$` match before a final newline
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(doc, schema)


@pytest.mark.parametrize("bad", BAD)
def test_an_allocation_names_its_vm_profile_by_the_name_rule(bad: str) -> None:
    doc = {
        "apiVersion": m.API_VERSION,
        "kind": "Allocation",
        "id": "req-1",
        "tenant": "acme",
        "sku": "s1",
        "gpu_count": 1,
        "region": "r1",
        "vm_profile": bad,
        "requested_at": "2026-11-01T08:00:00Z",
    }
    with pytest.raises(ValidationError):
        m.Allocation.model_validate(doc)
