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

from pydantic import BaseModel

from reconciler import codes as reconciler_codes
from reconciler.service import capacities, catalog, models, portalmodels, reads, telemetries, tenants, usages
from reconciler.service.pool import Pool
from schemas import agentwire
from schemas.errors import GpuaasError

PREFIX = "/api/v1"

NOT_FOUND = reconciler_codes.API_NOT_FOUND  # an allocation or node id the store does not know
ROUTE_NOT_FOUND = reconciler_codes.API_ROUTE_NOT_FOUND  # no such path
BAD_REQUEST = reconciler_codes.API_BAD_REQUEST  # a query parameter out of range or vocabulary
METHOD_NOT_ALLOWED = reconciler_codes.API_METHOD_NOT_ALLOWED  # everything is GET (and HEAD)
UNAUTHORIZED = reconciler_codes.API_UNAUTHORIZED  # no bearer token where one is required
TOKEN_INVALID = reconciler_codes.API_TOKEN_INVALID  # a bearer token that is not the configured one
DB_UNAVAILABLE = reconciler_codes.API_DB_UNAVAILABLE  # PostgreSQL cannot be reached
NO_SCHEMA = reconciler_codes.API_NO_SCHEMA  # the database was never migrated (nothing reconciled yet)
CAPACITY_COMPUTING = capacities.CapacityComputing.code  # first capacity model not ready yet
INTERNAL = reconciler_codes.API_INTERNAL  # a bug: see the server log
FORBIDDEN = reconciler_codes.API_FORBIDDEN  # a tenant token on an operator-only path

CODES = (
    NOT_FOUND,
    ROUTE_NOT_FOUND,
    BAD_REQUEST,
    METHOD_NOT_ALLOWED,
    UNAUTHORIZED,
    TOKEN_INVALID,
    DB_UNAVAILABLE,
    NO_SCHEMA,
    CAPACITY_COMPUTING,
    INTERNAL,
    FORBIDDEN,
)


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
    principal: tenants.Principal = tenants.OPERATOR_PRINCIPAL  # who asks: a tenant sees only its own


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


def _tenant(ctx: Context, q: Query) -> str | None:
    """The tenant filter: a tenant principal's own, whatever the query says (another tenant's list is empty)."""
    asked = _one(q, "tenant")
    mine = ctx.principal.tenant
    if mine is not None and asked is not None and asked != mine:
        return "!none"  # no tenant has this name (not a valid name): an empty page
    return mine if mine is not None else asked


def _operator_only(ctx: Context, what: str) -> None:
    if ctx.principal.tenant is not None:
        raise ApiError(403, FORBIDDEN, f"{what} is for operators; a tenant token reads its own allocations")


def _visible(ctx: Context, conn: Any, allocation_id: str) -> None:
    """404 for another tenant's allocation, exactly as for one that does not exist."""
    if ctx.principal.tenant is None:
        return
    row = conn.execute("SELECT tenant FROM allocations WHERE id = %s", (allocation_id,)).fetchone()
    if row is None or row[0] != ctx.principal.tenant:
        raise ApiError(404, NOT_FOUND, f"no allocation {allocation_id!r} in the store")


def _allocations(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    state = _choice(q, "state", reads.ALLOCATION_STATES)
    if ctx.principal.tenant is not None and _one(q, "node") is not None:
        _operator_only(ctx, "filtering by node")
    with ctx.pool.reading() as conn:
        return reads.allocations(
            conn,
            tenant=_tenant(ctx, q),
            state=state,
            node=_one(q, "node"),
            limit=_int(q, "limit", 1000, 1, 10_000),
            offset=_int(q, "offset", 0, 0, 10**9),
        )


def _allocation(ctx: Context, m: Sequence[str], _q: Query) -> Any:
    with ctx.pool.reading() as conn:
        _visible(ctx, conn, m[0])
        doc = reads.allocation(conn, m[0])
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no allocation {m[0]!r} in the store")
    return doc


def _telemetry(ctx: Context, m: Sequence[str], _q: Query) -> Any:
    with ctx.pool.reading() as conn:
        _visible(ctx, conn, m[0])
        doc = telemetries.allocation(conn, m[0])
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no allocation {m[0]!r} in the store")
    return doc


def _capacity(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    answer = ctx.capacity.get()
    doc = answer.computed.doc
    region, sku = _one(q, "region"), _one(q, "sku")
    offers = [
        o for o in doc["capacity"] if (region is None or o["region"] == region) and (sku is None or o["sku"] == sku)
    ]
    return {
        "revision": doc["revision"],
        "as_of": answer.computed.as_of.isoformat(),
        "stale": answer.stale,
        "computed_in_s": round(answer.computed.seconds, 3),
        "capacity": offers,
    }


def _skus(ctx: Context, _m: Sequence[str], _q: Query) -> Any:
    with ctx.pool.reading() as conn:
        return catalog.skus(conn)


def _images(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    sku = _one(q, "sku")
    with ctx.pool.reading() as conn:
        doc = catalog.images(conn, sku=sku)
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no SKU {sku!r} in the catalog")
    return doc


def _nodes(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    _operator_only(ctx, "the node list")
    state = _choice(q, "state", reads.SLOT_STATES)
    with ctx.pool.reading() as conn:
        return reads.nodes(
            conn,
            region=_one(q, "region"),
            state=state,
            limit=_int(q, "limit", 1000, 1, 10_000),
            offset=_int(q, "offset", 0, 0, 10**9),
        )


def _node(ctx: Context, m: Sequence[str], _q: Query) -> Any:
    _operator_only(ctx, "a node")
    with ctx.pool.reading() as conn:
        doc = reads.node(conn, m[0])
    if doc is None:
        raise ApiError(404, NOT_FOUND, f"no node {m[0]!r} in the store")
    return doc


def _drift(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    _operator_only(ctx, "drift")
    with ctx.pool.reading() as conn:
        return reads.drift(conn, node=_one(q, "node"))


def _history(ctx: Context, _m: Sequence[str], q: Query) -> Any:
    _operator_only(ctx, "reconciliation history")
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
            return usages.usage(conn, start=start, end=end, tenant=_tenant(ctx, q))
    except GpuaasError as e:
        if e.code.startswith("usage."):
            raise ApiError(400, BAD_REQUEST, e.message) from e
        raise


def _index(_ctx: Context, _m: Sequence[str], _q: Query) -> Any:
    return {"endpoints": sorted(PREFIX + p for p in OPENAPI["paths"])}


def _openapi(_ctx: Context, _m: Sequence[str], _q: Query) -> Any:
    return OPENAPI


_ID = r"([A-Za-z0-9][A-Za-z0-9._:-]{0,252})"
ROUTES: tuple[tuple[re.Pattern[str], Handler], ...] = tuple(
    (re.compile(f"^{PREFIX}{p}$"), h)
    for p, h in (
        ("/?", _index),
        ("/openapi.json", _openapi),
        ("/allocations", _allocations),
        (f"/allocations/{_ID}", _allocation),
        (f"/allocations/{_ID}/telemetry", _telemetry),
        ("/capacity", _capacity),
        ("/skus", _skus),
        ("/images", _images),
        ("/nodes", _nodes),
        (f"/nodes/{_ID}", _node),
        ("/drift", _drift),
        ("/history", _history),
        ("/usage", _usage),
    )
)


def handle(ctx: Context, path: str, query: Query) -> Any:
    """The JSON document for GET `path` (under PREFIX); ApiError for what a client got wrong."""
    for pattern, handler in ROUTES:
        m = pattern.match(path)
        if m:
            return handler(ctx, m.groups(), query)
    raise ApiError(404, ROUTE_NOT_FOUND, f"no such API path: {path}")


# ----------------------------------------------------------------- OpenAPI


def _param(name: str, where: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "description": description,
        "schema": schema or {"type": "string"},
    }


SERVE_CODES = (
    reconciler_codes.SERVE_HOST_NOT_ALLOWED,
    reconciler_codes.SERVE_REQUEST_TIMEOUT,
    reconciler_codes.SERVE_TOO_MANY_CONNECTIONS,
)


def _components() -> dict[str, Any]:
    schemas = models.components()
    codes = (*CODES, *SERVE_CODES, *agentwire.CODES, "ready.no_schema", "ready.db_unreachable")
    schemas["ErrorBody"]["properties"]["code"]["enum"] = list(dict.fromkeys(codes))
    return schemas


_ERROR = {"content": {"application/json": {"schema": models.ref(models.Error)}}}


def _get(summary: str, model: type[BaseModel], *params: dict[str, Any], not_found: bool = False) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": models.ref(model)}}},
        "400": {"description": BAD_REQUEST, **_ERROR},
        "401": {"description": f"{UNAUTHORIZED}, {TOKEN_INVALID}", **_ERROR},
        "421": {"description": "serve.host_not_allowed: a Host this server does not answer for", **_ERROR},
        "503": {"description": f"{DB_UNAVAILABLE}, {NO_SCHEMA}, serve.request_timeout", **_ERROR},
    }
    if not_found:
        responses["404"] = {"description": NOT_FOUND, **_ERROR}
    return {"get": {"summary": summary, "parameters": list(params), "responses": responses}}


def _agent(
    method: str, summary: str, model: type[BaseModel], *params: dict[str, Any], body: type[BaseModel] | None = None
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"node_token": []}],
        "parameters": [_param("node", "path", "this node's name (the token's node)"), *params],
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": models.ref(model)}}},
            "400": {"description": f"{BAD_REQUEST}, {agentwire.REPORT_INVALID}", **_ERROR},
            "401": {"description": agentwire.UNAUTHORIZED, **_ERROR},
            "403": {"description": agentwire.FORBIDDEN, **_ERROR},
            "503": {"description": DB_UNAVAILABLE, **_ERROR},
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": models.ref(body)}}}
    return {method: op}


_LIMIT = _param("limit", "query", "page size", {"type": "integer", "minimum": 1})
_OFFSET = _param("offset", "query", "items to skip", {"type": "integer", "minimum": 0})

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "gpuaas API",
        "version": "v1",
        "description": "Read-only view of allocations, capacity, nodes, drift, history and usage; "
        "the host agents' API under /agent. "
        'Errors are {"error": {"code", "message"}} with stable codes: ' + ", ".join(CODES),
    },
    "servers": [{"url": PREFIX}],
    "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "node_token": {
                "type": "http",
                "scheme": "bearer",
                "description": "a node token (gpuaas host token issue NODE)",
            },
        },
        "schemas": _components(),
    },
    "security": [{"bearer": []}, {}],
    "paths": {
        "/allocations": _get(
            "Allocations, oldest request first",
            models.AllocationPage,
            _param("tenant", "query", "only this tenant"),
            _param("state", "query", "only this state", {"type": "string", "enum": list(reads.ALLOCATION_STATES)}),
            _param("node", "query", "only allocations placed on this node"),
            _LIMIT,
            _OFFSET,
        ),
        "/allocations/{id}": _get(
            "One allocation: state and pending reason, placement, boot slot MAC and IP, host phase, claims, timestamps",
            models.Allocation,
            _param("id", "path", "allocation id"),
            not_found=True,
        ),
        "/allocations/{id}/telemetry": _get(
            "The guest's newest GPU telemetry (utilisation, memory, temperature, ECC), or state unavailable "
            "with the reason; a field the guest could not read is null, never 0",
            models.Telemetry,
            _param("id", "path", "allocation id"),
            not_found=True,
        ),
        "/capacity": _get(
            "Launchable capacity per region x SKU x GPU count (the numbers of `gpuaas status`)",
            models.Capacity,
            _param("region", "query", "only this region"),
            _param("sku", "query", "only this SKU"),
        ),
        "/skus": _get(
            "The SKUs on sale: display names, GPU counts, VM profiles, prices (minor units per hour)",
            portalmodels.SkuCatalog,
        ),
        "/images": _get(
            "Active images, each with the SKUs it can boot; with sku=, only that SKU's",
            portalmodels.ImageCatalog,
            _param("sku", "query", "only images this SKU can boot (404 for an unknown SKU)"),
            not_found=True,
        ),
        "/nodes": _get(
            "Nodes with slots by state",
            models.NodePage,
            _param("region", "query", "only this region"),
            _param(
                "state",
                "query",
                "only nodes with a slot in this state",
                {"type": "string", "enum": list(reads.SLOT_STATES)},
            ),
            _LIMIT,
            _OFFSET,
        ),
        "/nodes/{name}": _get(
            "One node: slots with state, claims and drift; its host report",
            models.Node,
            _param("name", "path", "node name"),
            not_found=True,
        ),
        "/drift": _get(
            "Drift findings the hosts reported, and invalid reports",
            models.Drift,
            _param("node", "query", "only this node"),
        ),
        "/history": _get("Recent reconciliations, newest first", models.History, _LIMIT),
        "/usage": _get(
            "GPU-hours and amounts per allocation and tenant, prorated to the window",
            models.Usage,
            _param("from", "query", "start (YYYY-MM-DD or ISO 8601; default: this month)"),
            _param("to", "query", "end, exclusive (default: now)"),
            _param("tenant", "query", "only this tenant"),
        ),
        "/openapi.json": _get("This document", models.OpenApiDocument),
        "/agent/nodes/{node}/plan": _agent(
            "get",
            "This node's plan; with `after`, a watch: answers when the generation differs from `after`, or "
            "after `wait` seconds with changed=false",
            agentwire.PlanAnswer,
            _param("after", "query", "the generation the agent holds", {"type": "integer", "minimum": 0}),
            _param(
                "wait",
                "query",
                f"seconds to wait for a change (at most {agentwire.MAX_WAIT_S:g})",
                {"type": "number", "minimum": 0, "maximum": agentwire.MAX_WAIT_S},
            ),
        ),
        "/agent/nodes/{node}/heartbeat": _agent(
            "post", "The agent is alive (written in batches)", agentwire.HeartbeatAnswer
        ),
        "/agent/nodes/{node}/reports/status": _agent(
            "post",
            "The node's status after a pass (slots, VMs, drift, errors, image cache, guest readiness); "
            "a report older than the stored one is ignored (written=false)",
            agentwire.ReportAnswer,
            body=agentwire.StatusReport,
        ),
        "/agent/nodes/{node}/rewipes": _agent(
            "get", "This node's pending `gpuaas slot rewipe` requests, oldest first", agentwire.RewipeRequests
        ),
        "/agent/nodes/{node}/rewipes/{id}": _agent(
            "post",
            f"The agent's answer to one rewipe request; 404 {agentwire.REWIPE_NOT_FOUND} for a request that "
            f"is not this node's, 409 {agentwire.REWIPE_ANSWERED} when answered already",
            agentwire.RewipeAnswered,
            _param("id", "path", "the request id", {"type": "integer", "minimum": 1}),
            body=agentwire.RewipeAnswer,
        ),
    },
}


def _write(summary: str, body: type[BaseModel] | None, *params: dict[str, Any]) -> dict[str, Any]:
    """A portal write (POST/DELETE, served by portal.py and intake.py): 202 with the bot's commit."""
    intake_error = {"content": {"application/json": {"schema": models.ref(portalmodels.IntakeError)}}}
    op: dict[str, Any] = {
        "summary": summary,
        "parameters": [
            *params,
            _param(
                "Idempotency-Key",
                "header",
                "the same key (per token) and body again gives "
                "the first answer (header Idempotent-Replayed: true), durably; another body: "
                "422 intake.idempotency_key_reused",
            ),
        ],
        "responses": {
            "202": {
                "description": "committed (and pushed) by the portal bot; the reconciler places it next",
                "content": {"application/json": {"schema": models.ref(portalmodels.Accepted)}},
            },
            "400": {"description": "intake.bad_request: not JSON or a field of the wrong type", **_ERROR},
            "401": {"description": f"{UNAUTHORIZED}, {TOKEN_INVALID}", **_ERROR},
            "403": {"description": "intake.tenant_mismatch: a tenant token naming another tenant", **_ERROR},
            "404": {"description": f"{NOT_FOUND} (another tenant's allocation is absent too)", **_ERROR},
            "405": {"description": f"{METHOD_NOT_ALLOWED}: serve has no --intake-repo", **_ERROR},
            "409": {
                "description": "intake.exists: the id is already in the desired-state repo; intake.already_released",
                **_ERROR,
            },
            "422": {
                "description": "request.invalid (problems as `gpuaas validate` prints them), "
                "intake.idempotency_key_reused",
                **intake_error,
            },
            "503": {"description": "intake.git_failed (nothing left behind), intake.db_unavailable", **_ERROR},
        },
    }
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": models.ref(body)}}}
    return op


OPENAPI["paths"]["/allocations"]["post"] = _write(
    "Request an allocation: validated as `gpuaas validate` would, committed to the desired-state repo by the "
    "portal bot and pushed",
    portalmodels.AllocationRequest,
)
OPENAPI["paths"]["/allocations/{id}"]["delete"] = _write(
    "Release an allocation: the bot commits state: released", None, _param("id", "path", "allocation id")
)
OPENAPI["paths"]["/events"] = {
    "get": {
        "summary": "Allocation state changes as server-sent events (text/event-stream) from the outbox: `id:` is the "
        "event id, `event:` its type, `data:` an AllocationEvent. Reconnect with Last-Event-ID (or after=) "
        "to miss nothing; a tenant token gets its tenant's events only",
        "parameters": [
            _param(
                "after",
                "query",
                "start after this event id (default: the newest; 0: all kept)",
                {"type": "integer", "minimum": 0},
            ),
            _param("Last-Event-ID", "header", "as after=, sent by EventSource on reconnect"),
        ],
        "responses": {
            "200": {
                "description": "the stream; it ends after a few minutes (reconnect with the last id)",
                "content": {"text/event-stream": {"schema": models.ref(portalmodels.AllocationEvent)}},
            },
            "400": {"description": BAD_REQUEST, **_ERROR},
            "401": {"description": f"{UNAUTHORIZED}, {TOKEN_INVALID}", **_ERROR},
            "503": {"description": DB_UNAVAILABLE, **_ERROR},
        },
    }
}
