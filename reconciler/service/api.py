"""The JSON API under /api/v1: routes, query parameters, stable error codes (the OpenAPI document: openapi.py).

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

from reconciler import codes as reconciler_codes
from reconciler.service import catalog, reads, statuscache, telemetries, tenants, usages
from reconciler.service.pool import Pool
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
CAPACITY_COMPUTING = statuscache.CapacityComputing.code  # first capacity model not ready yet
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
    capacity: statuscache.Cache
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
    from reconciler.service import openapi  # the document names this module's codes: imported when first served

    return {"endpoints": sorted(PREFIX + p for p in openapi.OPENAPI["paths"])}


def _openapi(_ctx: Context, _m: Sequence[str], _q: Query) -> Any:
    from reconciler.service import openapi

    return openapi.OPENAPI


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
