"""The JSON API under /api/v1: routes, query parameters, stable error codes, the OpenAPI document.

A route is a regular expression over the path and a function of the reader
context, the path's captures and the query; it returns plain data that the
server sends as JSON. Errors a client can cause are `ApiError`s with an HTTP
status and a stable code, sent as `{"error": {"code": ..., "message": ...}}`.
Do not change the code strings: the portal matches on them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reconciler.service import capacities, reads, telemetries, usages
from reconciler.service.pool import Pool
from schemas.errors import GpuaasError

PREFIX = "/api/v1"

NOT_FOUND = "api.not_found"  # an allocation or node id the store does not know
ROUTE_NOT_FOUND = "api.route_not_found"  # no such path
BAD_REQUEST = "api.bad_request"  # a query parameter out of range or vocabulary
METHOD_NOT_ALLOWED = "api.method_not_allowed"  # everything is GET (and HEAD)
UNAUTHORIZED = "api.unauthorized"  # no bearer token where one is required
TOKEN_INVALID = "api.token_invalid"  # noqa: S105 - an error code, not a secret; a bearer token that is not the configured one
DB_UNAVAILABLE = "api.db_unavailable"  # PostgreSQL cannot be reached
NO_SCHEMA = "api.no_schema"  # the database was never migrated (nothing reconciled yet)
CAPACITY_COMPUTING = capacities.CapacityComputing.code  # first capacity model not ready yet
INTERNAL = "api.internal"  # a bug: see the server log

CODES = (NOT_FOUND, ROUTE_NOT_FOUND, BAD_REQUEST, METHOD_NOT_ALLOWED, UNAUTHORIZED, TOKEN_INVALID, DB_UNAVAILABLE,
         NO_SCHEMA, CAPACITY_COMPUTING, INTERNAL)


class ApiError(GpuaasError):
    def __init__(self, status: int, code: str, message: str, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message, code=code)
        self.status = status
        self.headers = tuple(headers)


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


@dataclass(frozen=True, slots=True)
class Context:
    pool: Pool
    capacity: capacities.Cache


Query = Mapping[str, Sequence[str]]
Handler = Callable[[Context, Sequence[str], Query], Any]


def _one(query: Query, name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values else None


def _int(query: Query, name: str, default: int, lo: int, hi: int) -> int:
    text = _one(query, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, BAD_REQUEST, f"{name} must be an integer, not {text!r}") from None
    if not lo <= value <= hi:
        raise ApiError(400, BAD_REQUEST, f"{name} must be between {lo} and {hi}, not {value}")
    return value


def _choice(query: Query, name: str, allowed: Sequence[str]) -> str | None:
    value = _one(query, name)
    if value is not None and value not in allowed:
        raise ApiError(400, BAD_REQUEST, f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _allocations(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    state = _choice(q, "state", reads.ALLOCATION_STATES)
    with ctx.pool.reading() as conn:
        return reads.allocations(conn, tenant=_one(q, "tenant"), state=state, node=_one(q, "node"),
                                 limit=_int(q, "limit", 1000, 1, 10_000), offset=_int(q, "offset", 0, 0, 10**9))


def _allocation(ctx: Context, m: Sequence[str], _q: Query) -> Any:
    with ctx.pool.reading() as conn:
        doc = reads.allocation(conn, m[0])
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no allocation {m[0]!r} in the store")
    return doc


def _telemetry(ctx: Context, m: Sequence[str], _q: Query) -> Any:
    with ctx.pool.reading() as conn:
        doc = telemetries.allocation(conn, m[0])
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no allocation {m[0]!r} in the store")
    return doc


def _capacity(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    answer = ctx.capacity.get()
    doc = answer.computed.doc
    region, sku = _one(q, "region"), _one(q, "sku")
    offers = [o for o in doc["capacity"] if (region is None or o["region"] == region)
              and (sku is None or o["sku"] == sku)]
    return {"revision": doc["revision"], "as_of": answer.computed.as_of.isoformat(), "stale": answer.stale,
            "computed_in_s": round(answer.computed.seconds, 3), "capacity": offers}


def _nodes(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    state = _choice(q, "state", reads.SLOT_STATES)
    with ctx.pool.reading() as conn:
        return reads.nodes(conn, region=_one(q, "region"), state=state, limit=_int(q, "limit", 1000, 1, 10_000),
                           offset=_int(q, "offset", 0, 0, 10**9))


def _node(ctx: Context, m: Sequence[str], _q: Query) -> Any:
    with ctx.pool.reading() as conn:
        doc = reads.node(conn, m[0])
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no node {m[0]!r} in the store")
    return doc


def _drift(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    with ctx.pool.reading() as conn:
        return reads.drift(conn, node=_one(q, "node"))


def _history(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    with ctx.pool.reading() as conn:
        return {"items": reads.history(conn, _int(q, "limit", 20, 1, 1000))}


def _usage(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    now = dt.datetime.now(dt.UTC)
    start, end = usages.default_window(now)
    try:
        if (text := _one(q, "from")) is not None:
            start = usages.parse_time(text, what="from")
        if (text := _one(q, "to")) is not None:
            end = usages.parse_time(text, what="to")
        with ctx.pool.reading() as conn:
            return usages.usage(conn, start=start, end=end, tenant=_one(q, "tenant"))
    except GpuaasError as e:
        if e.code.startswith("usage."):
            raise ApiError(400, BAD_REQUEST, e.message) from e
        raise


def _index(_ctx: Context, _m: Sequence[str], _q: Query) -> Any:
    return {"endpoints": sorted(PREFIX + p for p in OPENAPI["paths"])}


def _openapi(_ctx: Context, _m: Sequence[str], _q: Query) -> Any:
    return OPENAPI


_ID = r"([A-Za-z0-9][A-Za-z0-9._:-]{0,252})"
ROUTES: tuple[tuple[re.Pattern[str], Handler], ...] = tuple((re.compile(f"^{PREFIX}{p}$"), h) for p, h in (
    ("/?", _index),
    ("/openapi.json", _openapi),
    ("/allocations", _allocations),
    (f"/allocations/{_ID}", _allocation),
    (f"/allocations/{_ID}/telemetry", _telemetry),
    ("/capacity", _capacity),
    ("/nodes", _nodes),
    (f"/nodes/{_ID}", _node),
    ("/drift", _drift),
    ("/history", _history),
    ("/usage", _usage),
))


def handle(ctx: Context, path: str, query: Query) -> Any:
    """The JSON document for GET `path` (under PREFIX); ApiError for what a client got wrong."""
    for pattern, handler in ROUTES:
        m = pattern.match(path)
        if m:
            return handler(ctx, m.groups(), query)
    raise ApiError(404, ROUTE_NOT_FOUND, f"no such API path: {path}")


# ----------------------------------------------------------------- OpenAPI


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _param(name: str, where: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "description": description,
            "schema": schema or {"type": "string"}}


def _get(summary: str, schema: dict[str, Any], *params: dict[str, Any], not_found: bool = False) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": schema}}},
        "400": {"description": BAD_REQUEST, "content": {"application/json": {"schema": _ref("Error")}}},
        "401": {"description": f"{UNAUTHORIZED}, {TOKEN_INVALID}",
                "content": {"application/json": {"schema": _ref("Error")}}},
        "503": {"description": f"{DB_UNAVAILABLE}, {NO_SCHEMA}",
                "content": {"application/json": {"schema": _ref("Error")}}},
    }
    if not_found:
        responses["404"] = {"description": NOT_FOUND, "content": {"application/json": {"schema": _ref("Error")}}}
    return {"get": {"summary": summary, "parameters": list(params), "responses": responses}}


_LIMIT = _param("limit", "query", "page size", {"type": "integer", "minimum": 1})
_OFFSET = _param("offset", "query", "items to skip", {"type": "integer", "minimum": 0})
_OBJ: dict[str, Any] = {"type": "object"}
_STR_OR_NULL: dict[str, Any] = {"type": ["string", "null"]}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "gpuaas read API", "version": "v1",
             "description": "Read-only view of allocations, capacity, nodes, drift, history and usage. "
                            "Errors are {\"error\": {\"code\", \"message\"}} with stable codes: " + ", ".join(CODES)},
    "servers": [{"url": PREFIX}],
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string", "enum": list(CODES)}, "message": {"type": "string"}}}}},
            "Allocation": {"type": "object", "required": ["id", "tenant", "state", "region", "sku", "gpu_count"],
                           "properties": {
                "id": {"type": "string"}, "tenant": {"type": "string"},
                "state": {"type": "string", "enum": list(reads.ALLOCATION_STATES)},
                "desired_state": {"type": "string", "enum": ["present", "released"]},
                "region": {"type": "string"}, "sku": {"type": "string"}, "gpu_count": {"type": "integer"},
                "node": _STR_OR_NULL, "slot_indexes": {"type": "array", "items": {"type": "integer"}},
                "vm_profile": _STR_OR_NULL, "image": _STR_OR_NULL,
                "pending": {"type": ["object", "null"], "properties": {
                    "code": {"type": "string"}, "message": {"type": "string"}, "since": _STR_OR_NULL}},
                "boot_slot": {"type": ["object", "null"], "properties": {
                    "slot_index": {"type": "integer"}, "mac_address": {"type": "string"},
                    "private_ip": {"type": "string"}}},
                "host": {"type": ["object", "null"], "properties": {
                    "vm_state": _STR_OR_NULL, "phase": _STR_OR_NULL, "reported_at": _STR_OR_NULL}},
                "lifecycle": {"type": ["object", "null"], "properties": {
                    "state": {"type": "string", "enum": ["pending", "reserved", "provisioning", "ready",
                                                         "releasing", "cleanup", "released", "failed"]},
                    "host_phase": _STR_OR_NULL, "boot_ip": _STR_OR_NULL, "host_unreachable": {"type": "boolean"},
                    "failed_attempts": {"type": "integer"},
                    "failure": {"type": ["object", "null"], "properties": {
                        "code": {"type": "string"}, "message": {"type": "string"}}},
                    "attempts": {"type": "array", "items": _OBJ}}},
                "claims": {"type": "array", "items": _OBJ},
                "requested_at": _STR_OR_NULL, "placed_at": _STR_OR_NULL, "active_at": _STR_OR_NULL,
                "release_requested_at": _STR_OR_NULL, "released_at": _STR_OR_NULL,
                "state_changed_at": _STR_OR_NULL}},
            "Page": {"type": "object", "required": ["total", "items"], "properties": {
                "total": {"type": "integer"}, "offset": {"type": "integer"}, "limit": {"type": "integer"},
                "items": {"type": "array", "items": _OBJ}}},
        },
    },
    "security": [{"bearer": []}, {}],
    "paths": {
        "/allocations": _get("Allocations, oldest request first", _ref("Page"),
                             _param("tenant", "query", "only this tenant"),
                             _param("state", "query", "only this state",
                                    {"type": "string", "enum": list(reads.ALLOCATION_STATES)}),
                             _param("node", "query", "only allocations placed on this node"), _LIMIT, _OFFSET),
        "/allocations/{id}": _get("One allocation: state and pending reason, placement, boot slot MAC and IP, "
                                  "host phase, claims, timestamps", _ref("Allocation"),
                                  _param("id", "path", "allocation id"), not_found=True),
        "/allocations/{id}/telemetry": _get(
            "The guest's newest GPU telemetry (utilisation, memory, temperature, ECC), or state unavailable "
            "with the reason; a field the guest could not read is null, never 0", {"type": "object", "properties": {
                "allocation_id": {"type": "string"}, "allocation_state": {"type": "string"},
                "state": {"type": "string", "enum": ["available", "unavailable"]}, "reason": _STR_OR_NULL,
                "node": _STR_OR_NULL, "received_at": _STR_OR_NULL, "age_s": {"type": ["number", "null"]},
                "gpus": {"type": "array", "items": _OBJ}}},
            _param("id", "path", "allocation id"), not_found=True),
        "/capacity": _get("Launchable capacity per region x SKU x GPU count (the numbers of `gpuaas status`)",
                          {"type": "object", "properties": {
                              "revision": _STR_OR_NULL, "as_of": {"type": "string"}, "stale": {"type": "boolean"},
                              "computed_in_s": {"type": "number"}, "capacity": {"type": "array", "items": _OBJ}}},
                          _param("region", "query", "only this region"), _param("sku", "query", "only this SKU")),
        "/nodes": _get("Nodes with slots by state", _ref("Page"), _param("region", "query", "only this region"),
                       _param("state", "query", "only nodes with a slot in this state",
                              {"type": "string", "enum": list(reads.SLOT_STATES)}), _LIMIT, _OFFSET),
        "/nodes/{name}": _get("One node: slots with state, claims and drift; its host report", _OBJ,
                              _param("name", "path", "node name"), not_found=True),
        "/drift": _get("Drift findings the hosts reported, and invalid reports", _OBJ,
                       _param("node", "query", "only this node")),
        "/history": _get("Recent reconciliations, newest first", _OBJ, _LIMIT),
        "/usage": _get("GPU-hours and amounts per allocation and tenant, prorated to the window", _OBJ,
                       _param("from", "query", "start (YYYY-MM-DD or ISO 8601; default: this month)"),
                       _param("to", "query", "end, exclusive (default: now)"),
                       _param("tenant", "query", "only this tenant")),
        "/openapi.json": _get("This document", _OBJ),
    },
}
