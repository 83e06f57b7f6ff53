"""JSON Schemas of the desired-state kinds, generated from the models.

The committed files under schemas/ are what editors use
(`# yaml-language-server: $schema=...`); a test fails when they drift from
the models, and `gpuaas schema --write schemas` regenerates them.
"""

from __future__ import annotations

import json
from typing import Any

from desired import models as m

SCHEMA_ID = "https://gpuaas.io/schemas/v1alpha1/{kind}.schema.json"


def generate() -> dict[str, dict[str, Any]]:
    """kind -> JSON Schema (draft 2020-12) for every desired-state kind."""
    out: dict[str, dict[str, Any]] = {}
    for kind, model in sorted(m.KINDS.items()):
        schema = model.model_json_schema(by_alias=True, mode="validation")
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": SCHEMA_ID.format(kind=kind),
            **schema,
        }
        out[kind] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def filename(kind: str) -> str:
    return f"{kind}.schema.json"
