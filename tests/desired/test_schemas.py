"""The committed JSON Schemas match the models, and every example validates against them."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from desired import jsonschemas
from desired.reading import loading, safefiles

ROOT = Path(__file__).parent.parent.parent
SCHEMAS = ROOT / "schemas"


@pytest.mark.parametrize("kind", sorted(jsonschemas.generate()))
def test_committed_schema_is_current(kind: str) -> None:
    committed = (SCHEMAS / jsonschemas.filename(kind)).read_text()
    assert committed == jsonschemas.render(jsonschemas.generate()[kind]), (
        f"schemas/{jsonschemas.filename(kind)} is stale: run `gpuaas schema --write schemas`"
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def test_examples_validate_against_committed_schemas() -> None:
    result = loading.parse_files(safefiles.iter_directory(ROOT / "examples" / "fleet"))
    assert not result.errors
    checked = 0
    for kind, (_, src) in zip((k for k, _ in result.state.sources), result.state.sources.items(), strict=True):
        schema = json.loads((SCHEMAS / jsonschemas.filename(kind)).read_text())
        jsonschema.validate(_jsonable(src.doc.value), schema)
        checked += 1
    assert checked == 28


def test_schema_rejects_what_the_loader_rejects() -> None:
    schema = json.loads((SCHEMAS / "Node.schema.json").read_text())
    bad = {
        "apiVersion": "gpuaas.io/v1alpha1",
        "kind": "Node",
        "name": "n1",
        "region": "r",
        "pool": "p",
        "profile_tags": ["gpuaas-profile-baremetal"],
        "os_disk": "/dev/nvme0n1",
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
