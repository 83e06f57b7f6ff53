"""The ASGI application of `gpuaas serve` (Starlette under uvicorn): guards, the agent API, the read side.

Layers, outermost first:

- `HostAllowList`: a request whose `Host` is not a name this server serves
  gets 421 `serve.host_not_allowed` (DNS rebinding: a page in a browser on
  this machine must not read the API through a name that resolves to
  127.0.0.1). /healthz answers any Host (liveness probes dial addresses).
- `Deadline`: a request (body read, handler, response write) gets at most
  `request_timeout_s` in all; past it the client gets 503
  `serve.request_timeout`, or, mid-response, the connection is cut. Slow
  header senders are cut in the protocol (server.py).
- the agent API (`/api/v1/agent/...`, node tokens, async: a waiting watch
  holds no thread) and everything else through `Service.respond`, the
  read-only API, dashboard and metrics, run in worker threads (their queries
  are synchronous psycopg).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from anyio import to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler import codes as reconciler_codes
from reconciler.service import api, events, portal
from schemas import agentwire
from schemas.errors import GpuaasError, TemporaryError

if TYPE_CHECKING:
    from reconciler.service import agents, server

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("gpuaas.serve")

HOST_NOT_ALLOWED = reconciler_codes.SERVE_HOST_NOT_ALLOWED
REQUEST_TIMEOUT = reconciler_codes.SERVE_REQUEST_TIMEOUT
TOO_MANY_CONNECTIONS = reconciler_codes.SERVE_TOO_MANY_CONNECTIONS
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _json_bytes(doc: Any) -> bytes:
    return json.dumps(doc, default=str, separators=(",", ":")).encode()


def _headers(content_type: str, length: int, extra: Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    # Names as clients print them (HTTP does not care; people reading a capture do).
    return [
        (b"Content-Type", content_type.encode()),
        (b"Content-Length", str(length).encode()),
        (b"Cache-Control", b"no-store"),
        (b"X-Content-Type-Options", b"nosniff"),
        *((k.encode(), v.encode()) for k, v in extra),
    ]


async def _send_json(send: Send, status: int, doc: Any, headers: Sequence[tuple[str, str]] = ()) -> None:
    body = _json_bytes(doc)
    raw = _headers("application/json", len(body), headers)
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _deny(scope: Scope, receive: Receive, send: Send, status: int, doc: Any) -> None:
    """An HTTP error answer; for a WebSocket handshake, the same answer as its HTTP response (never accepted)."""
    if scope["type"] != "websocket":
        await _send_json(send, status, doc)
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        body = _json_bytes(doc)
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": _headers("application/json", len(body), ()),
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # a server without the denial-response extension answers 403
        await send({"type": "websocket.close", "code": 1008})


def host_name(value: str) -> str:
    """The name part of a Host header: `[::1]:8080` -> `::1`, `Example.COM.:80` -> `example.com`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


class HostAllowList:
    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = frozenset(host_name(a) for a in allowed if a != "*")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # WebSockets too: a console handshake from a page on a rebound name is refused like any request.
        if scope["type"] not in ("http", "websocket") or self.any or scope.get("path") == "/healthz":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"), "")
        if host_name(given) in self.allowed:
            await self.app(scope, receive, send)
            return
        await _deny(
            scope,
            receive,
            send,
            421,
            api.error_body(
                HOST_NOT_ALLOWED, f"this server does not answer for Host {given[:100]!r} (serve --allow-host NAME)"
            ),
        )


class Deadline:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.seconds <= 0 or scope.get("path") == events.PATH:
            await self.app(scope, receive, send)  # an event stream is long by design (it ends itself: events.py)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            async with asyncio.timeout(self.seconds):  # no task per request (wait_for would make one)
                await self.app(scope, receive, tracked)
        except TimeoutError:
            if started:
                raise  # part of a response left already: cutting the connection is all that is left
            await _send_json(
                send,
                503,
                api.error_body(REQUEST_TIMEOUT, f"the request took longer than {self.seconds:g}s"),
                (("Connection", "close"),),
            )


def _agent_error(status: int, code: str, message: str, headers: Sequence[tuple[str, str]] = ()) -> JSONResponse:
    return JSONResponse(
        api.error_body(code, message), status_code=status, headers={"Cache-Control": "no-store", **dict(headers)}
    )


class AgentRoutes:
    """The agent API: each handler authenticates the node token, then works only for that node."""

    def __init__(self, gateway: agents.Gateway) -> None:
        self.gateway = gateway

    async def _node(self, request: Request) -> str | JSONResponse:
        scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
        challenge = (("WWW-Authenticate", 'Bearer realm="gpuaas-agent"'),)
        if scheme.lower() != "bearer" or not token.strip():
            return _agent_error(
                401,
                agentwire.UNAUTHORIZED,
                "an agent request needs Authorization: Bearer <node token> (gpuaas host token issue NODE)",
                challenge,
            )
        try:
            node = await self.gateway.authenticate(token.strip())
        except TemporaryError as e:
            return _agent_error(503, api.DB_UNAVAILABLE, e.message, (("Retry-After", "1"),))
        if node is None:
            return _agent_error(
                401, agentwire.UNAUTHORIZED, "this node token is not known (revoked or rotated?)", challenge
            )
        wanted = request.path_params["node"]
        if wanted != node:
            return _agent_error(403, agentwire.FORBIDDEN, f"this token is node {node}'s; it may not act for {wanted}")
        return node

    async def plan(self, request: Request) -> Response:
        node = await self._node(request)
        if isinstance(node, JSONResponse):
            return node
        try:
            after = _query_number(request, "after", int, None, lo=0, hi=2**62)
            wait = _query_number(request, "wait", float, 0.0, lo=0.0, hi=agentwire.MAX_WAIT_S)
        except ValueError as e:
            return _agent_error(400, api.BAD_REQUEST, str(e))
        if after is not None:
            self.gateway.heartbeat(node)  # an agent watching its plan is alive: its watches are heartbeats too
        try:
            answer = await self.gateway.plan(node, after, wait)
        except TemporaryError as e:
            return _agent_error(503, api.DB_UNAVAILABLE, e.message, (("Retry-After", "1"),))
        except GpuaasError as e:
            log.error("plan of %s: %s: %s", node, e.code, e.message, extra={"event": "serve.agent.failed"})
            return _agent_error(500, e.code, e.message)
        return JSONResponse(answer.model_dump(mode="json"), headers={"Cache-Control": "no-store"})

    async def heartbeat(self, request: Request) -> Response:
        node = await self._node(request)
        if isinstance(node, JSONResponse):
            return node
        self.gateway.heartbeat(node)
        return JSONResponse(agentwire.HeartbeatAnswer(node=node, accepted=True).model_dump(mode="json"))

    async def report(self, request: Request) -> Response:  # noqa: PLR0911 - one return per outcome
        node = await self._node(request)
        if isinstance(node, JSONResponse):
            return node
        kind = request.path_params["kind"]
        if kind not in agentwire.REPORT_KINDS:
            return _agent_error(
                404,
                agentwire.REPORT_KIND_UNKNOWN,
                f"no report kind {kind!r} (known: {', '.join(agentwire.REPORT_KINDS)})",
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > agentwire.MAX_REPORT_BYTES:
                return _agent_error(413, agentwire.TOO_LARGE, f"a report is at most {agentwire.MAX_REPORT_BYTES} bytes")
        try:
            doc = json.loads(body)
        except ValueError as e:
            return _agent_error(400, agentwire.REPORT_INVALID, f"the report is not JSON: {e}")
        if not isinstance(doc, dict):
            return _agent_error(400, agentwire.REPORT_INVALID, "the report is not a JSON object")
        from reconciler.service import agents as agent_service

        try:
            answer = await self.gateway.report(node, kind, doc)
        except agent_service.ReportInvalid as e:
            return _agent_error(400, agentwire.REPORT_INVALID, e.message)
        except TemporaryError as e:
            return _agent_error(503, api.DB_UNAVAILABLE, e.message, (("Retry-After", "1"),))
        return JSONResponse(answer.model_dump(mode="json"))

    async def rewipes(self, request: Request) -> Response:
        node = await self._node(request)
        if isinstance(node, JSONResponse):
            return node
        try:
            answer = await self.gateway.rewipes(node)
        except TemporaryError as e:
            return _agent_error(503, api.DB_UNAVAILABLE, e.message, (("Retry-After", "1"),))
        except GpuaasError as e:
            log.error("rewipes of %s: %s: %s", node, e.code, e.message, extra={"event": "serve.agent.failed"})
            return _agent_error(500, e.code, e.message)
        return JSONResponse(answer.model_dump(mode="json"), headers={"Cache-Control": "no-store"})

    async def answer_rewipe(self, request: Request) -> Response:  # noqa: PLR0911 - one return per outcome
        from pydantic import ValidationError

        from reconciler.service import agents as agent_service

        node = await self._node(request)
        if isinstance(node, JSONResponse):
            return node
        request_id = request.path_params["request_id"]
        body = await request.body()
        if len(body) > 64 * 1024:
            return _agent_error(413, agentwire.TOO_LARGE, "a rewipe answer is at most 64 KiB")
        try:
            answer = agentwire.RewipeAnswer.model_validate_json(body)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(document)"
            return _agent_error(400, agentwire.REPORT_INVALID, f"rewipe answer: {where}: {first['msg']}")
        try:
            done = await self.gateway.answer_rewipe(node, request_id, answer)
        except agent_service.RewipeNotFound as e:
            return _agent_error(404, e.code, e.message)
        except agent_service.RewipeAnswered as e:
            return _agent_error(409, e.code, e.message)
        except TemporaryError as e:
            return _agent_error(503, api.DB_UNAVAILABLE, e.message, (("Retry-After", "1"),))
        except GpuaasError as e:
            log.error("rewipe answer of %s: %s: %s", node, e.code, e.message, extra={"event": "serve.agent.failed"})
            return _agent_error(500, e.code, e.message)
        return JSONResponse(done.model_dump(mode="json"))


def _query_number(request: Request, name: str, kind: type[Any], default: Any, *, lo: float, hi: float) -> Any:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {text[:40]!r}") from None
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}, not {text[:40]}")
    return value


def _read_side(service: server.Service) -> ASGIApp:
    """Everything but the agent API: `Service.respond` (synchronous queries) in a worker thread."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        target = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        auth = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), "")
        t0 = time.perf_counter()
        resp = await to_thread.run_sync(service.respond, scope["method"], target, {"Authorization": auth})
        ms = round((time.perf_counter() - t0) * 1000, 1)
        log.info(
            "%s %s %d %.1fms",
            scope["method"],
            scope["path"],
            resp.status,
            ms,
            extra={
                "event": "request",
                "method": scope["method"],
                "path": scope["path"],
                "status": resp.status,
                "ms": ms,
            },
        )
        headers = _headers(resp.content_type, len(resp.body), resp.headers)
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else resp.body})

    return app


async def _no_route(request: Request, _exc: Exception) -> Response:
    return _agent_error(404, api.ROUTE_NOT_FOUND, f"no such agent API path: {request.url.path[:200]}")


async def _no_method(request: Request, _exc: Exception) -> Response:
    return _agent_error(405, api.METHOD_NOT_ALLOWED, f"{request.method} is not allowed on {request.url.path[:200]}")


_PLAN_PREFIX = agentwire.PREFIX + "/nodes/"


def _fast_watch(gateway: agents.Gateway) -> Callable[[Scope, Send], Awaitable[bool]]:
    """The steady state of ten thousand agents, without the framework: a plan read or watch by a known token.

    Anything else (an unknown or uncached token, another path, a bad query, an
    error) returns False and goes the framework's way (AgentRoutes), which
    gives every answer and error; this path only saves the per-request cost of
    the common case.
    """

    async def handle(scope: Scope, send: Send) -> bool:  # noqa: PLR0911 - every "not the common case" is False
        path: str = scope.get("path", "")
        if scope.get("method") != "GET" or not path.startswith(_PLAN_PREFIX) or not path.endswith("/plan"):
            return False
        node = path[len(_PLAN_PREFIX) : -len("/plan")]
        if not node or "/" in node:
            return False
        auth = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
        if auth[:7].lower() != b"bearer ":
            return False
        if gateway.cached_node(auth[7:].decode("latin-1").strip()) != node:
            return False
        try:
            query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), strict_parsing=False))
            after = int(query["after"]) if "after" in query else None
            wait = float(query.get("wait", 0.0))
        except ValueError:
            return False
        if (after is not None and not 0 <= after <= 2**62) or not 0 <= wait <= agentwire.MAX_WAIT_S:
            return False
        if after is not None:
            gateway.heartbeat(node)
        try:
            answer = await gateway.plan(node, after, wait)
        except TemporaryError:
            return False  # the framework's path answers 503 with the reason
        body = answer.model_dump_json().encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-store"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
        return True

    return handle


def _websockets(console_app: ASGIApp | None, connections: Callable[[], int] | None, max_connections: int) -> ASGIApp:
    """WebSocket handshakes: the console route when `serve --console-credentials` mounted it, else 404.

    uvicorn's --limit-concurrency refuses HTTP requests only, never an upgrade:
    a console is refused here (503) once the server holds `max_connections`.
    """
    from reconciler.service import console

    pattern = re.compile("^" + re.escape(console.PATH).replace(re.escape("{allocation_id}"), "[^/]+") + "$")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if console_app is None or not pattern.match(path):
            await _deny(
                scope, receive, send, 404, api.error_body(api.ROUTE_NOT_FOUND, f"no such WebSocket path: {path[:200]}")
            )
        elif connections is not None and connections() > max_connections:
            await _deny(
                scope,
                receive,
                send,
                503,
                api.error_body(
                    TOO_MANY_CONNECTIONS, f"this server holds {max_connections} connections (serve --max-connections)"
                ),
            )
        else:
            await console_app(scope, receive, send)

    return app


def build(
    service: server.Service,
    gateway: agents.Gateway,
    *,
    allowed_hosts: Sequence[str],
    request_timeout_s: float,
    console_app: ASGIApp | None = None,
    connections: Callable[[], int] | None = None,
    max_connections: int = 16384,
) -> ASGIApp:
    routes = AgentRoutes(gateway)
    node = "{node:str}"

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    agent_app = Starlette(
        routes=[
            Route(f"{agentwire.PREFIX}/nodes/{node}/plan", routes.plan, methods=["GET"]),
            Route(f"{agentwire.PREFIX}/nodes/{node}/heartbeat", routes.heartbeat, methods=["POST"]),
            Route(f"{agentwire.PREFIX}/nodes/{node}/reports/{{kind:str}}", routes.report, methods=["POST"]),
            Route(f"{agentwire.PREFIX}/nodes/{node}/rewipes", routes.rewipes, methods=["GET"]),
            Route(
                f"{agentwire.PREFIX}/nodes/{node}/rewipes/{{request_id:int}}", routes.answer_rewipe, methods=["POST"]
            ),
        ],
        lifespan=lifespan,
        exception_handlers={404: _no_route, 405: _no_method},
    )
    read_side = _read_side(service)
    fast = _fast_watch(gateway)
    websockets = _websockets(console_app, connections, max_connections)

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or scope.get("path", "").startswith(agentwire.PREFIX + "/"):
            if not await fast(scope, send):
                await agent_app(scope, receive, send)
        elif scope["type"] == "http" and scope.get("path") == events.PATH and scope.get("method") == "GET":
            await events.stream(service, service.events, scope, receive, send)
        elif scope["type"] == "http" and portal.handles(scope):
            await portal.handle(service, scope, receive, send)
        elif scope["type"] == "http":
            await read_side(scope, receive, send)
        elif scope["type"] == "websocket":
            await websockets(scope, receive, send)

    return HostAllowList(Deadline(dispatch, request_timeout_s), allowed_hosts)
