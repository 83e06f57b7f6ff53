"""The OpenAPI document of the JSON API (/api/v1/openapi.json): every route, its answer's model and error codes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from reconciler import codes as reconciler_codes
from reconciler.service import models, portalmodels, reads
from reconciler.service.api import (
    BAD_REQUEST,
    CODES,
    DB_UNAVAILABLE,
    METHOD_NOT_ALLOWED,
    NO_SCHEMA,
    NOT_FOUND,
    PREFIX,
    TOKEN_INVALID,
    UNAUTHORIZED,
)
from schemas import agentwire


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
