"""The OpenAPI document is generated from pydantic models, valid, and true: every response matches it.

Real responses from a real `gpuaas serve` (the applied example fleet with
host reports, conftest.py) are validated with jsonschema against the
document's own schema for that path, so a field a reader adds without
declaring it (the models forbid extra fields) fails here.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from reconciler.service import openapi
from tests.service.conftest import Served

PATHS = [
    ("/allocations", "/api/v1/allocations"),
    ("/allocations", "/api/v1/allocations?state=pending"),
    ("/allocations/{id}", "/api/v1/allocations/alloc-0001"),
    ("/capacity", "/api/v1/capacity"),
    ("/skus", "/api/v1/skus"),
    ("/images", "/api/v1/images"),
    ("/images", "/api/v1/images?sku=h200-sxm-slice"),
    ("/nodes", "/api/v1/nodes"),
    ("/nodes/{name}", "/api/v1/nodes/h200-use1-s01"),
    ("/nodes/{name}", "/api/v1/nodes/h200-use1-s02"),
    ("/nodes/{name}", "/api/v1/nodes/h200-euw1-s01"),
    ("/drift", "/api/v1/drift"),
    ("/history", "/api/v1/history"),
    ("/usage", "/api/v1/usage"),
    ("/openapi.json", "/api/v1/openapi.json"),
]


def check(doc: dict[str, Any], path: str, status: str, body: Any, method: str = "get") -> None:
    schema = doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": doc["components"]}).validate(body)


def test_the_document_is_valid_openapi_and_names_no_bare_object() -> None:
    validate(openapi.OPENAPI)
    for path, item in openapi.OPENAPI["paths"].items():
        for op in item.values():
            ok = op["responses"].get("200") or op["responses"]["202"]  # 202: the portal's writes
            schema = next(iter(ok["content"].values()))["schema"]  # JSON, or the event stream's events
            assert "$ref" in schema, path  # a declared model, never {"type": "object"}
    allocation = openapi.OPENAPI["components"]["schemas"]["Allocation"]
    assert allocation["additionalProperties"] is False
    assert {"present", "capacity_shape", "updated_at", "boot_slot", "lifecycle"} <= set(allocation["properties"])


@pytest.mark.parametrize(("path", "url"), PATHS)
def test_every_response_matches_the_document(served: Served, path: str, url: str) -> None:
    doc = served.json("/api/v1/openapi.json")
    check(doc, path, "200", served.json(url))


def test_error_responses_match_the_document(served: Served) -> None:
    doc = served.json("/api/v1/openapi.json")
    check(doc, "/allocations/{id}", "404", served.json("/api/v1/allocations/nope", status=404))
    check(doc, "/allocations", "400", served.json("/api/v1/allocations?limit=0", status=400))


def test_an_undeclared_field_fails_the_check() -> None:
    with pytest.raises(jsonschema.ValidationError):
        check(openapi.OPENAPI, "/history", "200", {"items": [], "surprise": 1})
