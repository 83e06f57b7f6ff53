"""The HTTP side of `gpuaas serve`: listening, limits, bearer tokens, health, and dispatch to API, dashboard, metrics.

An ASGI application (asgi.py, Starlette) under uvicorn: one event loop holds
thousands of connections (a waiting agent watch costs a future, not a
thread); the read-only pages run their synchronous queries in worker threads
from a `psycopg_pool` pool. Rules kept here:

- it binds 127.0.0.1 unless told otherwise, and a non-loopback bind needs a
  token file; with a token every request but /healthz and the agent API
  (which has node tokens of its own) needs `Authorization: Bearer <token>`
  (compared in constant time);
- a token file readable (or writable) by group or others is refused, as ssh
  refuses such a key;
- it answers only for the host names it serves (`--allow-host`, loopback
  names and the listen address by default): DNS rebinding gets 421;
- at most `--max-connections` connections (more get 503), at most
  `--request-timeout` seconds per request, and a client that has not sent
  its request head within `--header-timeout` seconds is cut (slowloris);
- /healthz says the process is alive (no database); /readyz says the
  database is reachable, the schema is there, the newest reconciliation is
  recent enough (when --max-reconcile-age is set) and reconciliation is not
  failing for longer than --failing-grace; otherwise 503 and the reason;
- errors leave as `{"error": {"code", "message"}}` (an HTML page for the
  dashboard's own pages), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import json
import logging
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from reconciler import codes as reconciler_codes
from reconciler.service import api, asgi, dashboard, metrics, readiness, statuscache, tenants
from reconciler.service.listening import _bind, _protocol_with_header_deadline, _Uvicorn
from reconciler.service.pool import Pool
from reconciler.service.servesettings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ServeError,
    Settings,
    is_loopback,
    load_token,
    parse_listen,
    token_from,
)
from schemas import codes as schemas_codes
from schemas.errors import GpuaasError, TemporaryError

if TYPE_CHECKING:
    from reconciler.service import agents, intake, webhooks

# What `gpuaas serve` and the tests use, wherever it lives (servesettings: the settings and the token file).
__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "HTTPServer",
    "Response",
    "ServeError",
    "Service",
    "Settings",
    "is_loopback",
    "json_response",
    "load_token",
    "make_server",
    "parse_listen",
    "token_from",
]

log = logging.getLogger("gpuaas.serve")

_HTML_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())


def json_response(status: int, doc: Any, headers: Sequence[tuple[str, str]] = ()) -> Response:
    return Response(
        status, json.dumps(doc, default=str, separators=(",", ":")).encode(), "application/json", tuple(headers)
    )


class Service:
    """Everything a request needs; `respond` is the whole server minus sockets (tests call it directly too)."""

    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings
        self.gateway: agents.Gateway | None = None  # set by HTTPServer: the agent API's state, for metrics
        self.pool = Pool(url, size=settings.pool_size)
        self.capacity = statuscache.Cache(
            self.pool, policy=settings.policy, refresh_s=settings.capacity_refresh_s, wait_s=settings.capacity_wait_s
        )
        self.capacity.keep_in(url)  # a restart starts from the last computed document (keptcapacity)
        self.ctx = api.Context(self.pool, self.capacity)
        self.dashboard = dashboard.Dashboard(self.ctx, refresh_s=settings.refresh_s)
        self.registry = metrics.registry(self.pool, self.capacity)
        self._tenant_tokens: tuple[tuple[int, int], tenants.TenantTokens] | None = None
        self._tenant_lock = threading.Lock()
        if settings.tenant_tokens is not None:
            self.tenant_tokens()  # a bad file stops the start, not the first request
        from reconciler.service import events

        self.events = events.Hub(self.pool)
        self.intake: intake.Intake | None = None
        if settings.intake_repo is not None:
            from reconciler.service import intake

            self.intake = intake.Intake(url, settings.intake_repo, settings.intake_push)
        from reconciler.service import portal

        self.registry.register(portal.PortalCollector(self))
        self.webhooks: webhooks.Deliverer | None = None
        if settings.webhook_url is not None and settings.webhook_secret is not None:  # Settings.check: both
            from reconciler.service import webhooks

            self.webhooks = webhooks.Deliverer(
                url,
                self.pool,
                settings.webhook_url,
                webhooks.load_secret(settings.webhook_secret),
                backoff_s=settings.webhook_backoff_s,
            )
            self.webhooks.start()

    def close(self, timeout: float = 60.0) -> None:
        if self.webhooks is not None:
            self.webhooks.stop()
        if self.intake is not None:
            self.intake.close()
        self.pool.close()
        self.capacity.join(timeout)

    def authorized(self, headers: Mapping[str, str]) -> api.ApiError | None:
        token = self.settings.token
        if token is None:
            return None
        given = headers.get("Authorization") or ""
        scheme, _, value = given.partition(" ")
        challenge = (("WWW-Authenticate", 'Bearer realm="gpuaas"'),)
        if scheme.lower() != "bearer" or not value.strip():
            return api.ApiError(
                401, api.UNAUTHORIZED, "this server needs Authorization: Bearer <token>", headers=challenge
            )
        if not hmac.compare_digest(value.strip().encode(), token.encode()):
            return api.ApiError(401, api.TOKEN_INVALID, "the bearer token is not this server's", headers=challenge)
        return None

    def tenant_tokens(self) -> tenants.TenantTokens | None:
        """The tenant token file, re-read when its mtime or size changed (a rotation needs no restart)."""
        path = self.settings.tenant_tokens
        if path is None:
            return None
        with self._tenant_lock:
            try:
                st = path.stat()
                key = (st.st_mtime_ns, st.st_size)
            except OSError:
                key = (-1, -1)
            if self._tenant_tokens is None or self._tenant_tokens[0] != key:
                self._tenant_tokens = (key, tenants.load(path))
            return self._tenant_tokens[1]

    def principal(self, headers: Mapping[str, str]) -> tenants.Principal:
        """Who asks: the operator token (or no token on an open server) is the operator; a tenant token, its tenant.

        Raises ApiError 401 for a missing or unknown token where one is needed.
        """
        given = headers.get("Authorization") or ""
        scheme, _, value = given.partition(" ")
        value = value.strip()
        table = self.tenant_tokens()
        if table is not None and scheme.lower() == "bearer" and value:
            tenant = table.tenant_of(value)
            if tenant is not None:
                return tenants.Principal(tenant)
        refused = self.authorized(headers)
        if refused is not None:
            raise refused
        return tenants.OPERATOR_PRINCIPAL

    def respond(self, method: str, target: str, headers: Mapping[str, str]) -> Response:  # noqa: PLR0911 - one return per outcome
        parts = urlsplit(target)
        path = unquote(parts.path) or "/"
        query = parse_qs(parts.query)
        html = not (path.startswith("/api/") or path in ("/healthz", "/readyz", "/metrics"))
        try:
            if method not in ("GET", "HEAD"):
                raise api.ApiError(
                    405,
                    api.METHOD_NOT_ALLOWED,
                    f"{method} is not allowed: this server is read-only",
                    headers=(("Allow", "GET, HEAD"),),
                )
            if path == "/healthz":
                return json_response(200, {"status": "ok"})
            who = self.principal(headers)
            if who.tenant is not None and not path.startswith(api.PREFIX + "/"):
                raise api.ApiError(403, api.FORBIDDEN, "the dashboard and /metrics are for operators")
            return self._route(path, query, who)
        except api.ApiError as e:
            return self._error(e.status, e.code, e.message, html=html, headers=e.headers)
        except TemporaryError as e:
            retry = (("Retry-After", str(max(1, round(e.delay)))),)
            code = api.DB_UNAVAILABLE if e.code == schemas_codes.DB_UNAVAILABLE else e.code
            return self._error(503, code, e.message, html=html, headers=retry)
        except GpuaasError as e:
            if e.code == reconciler_codes.STATUS_NO_SCHEMA or (
                e.code == schemas_codes.DB_ERROR and not self._schema_applied()
            ):
                return self._error(
                    503, api.NO_SCHEMA, "the database has no schema yet: nothing was reconciled", html=html
                )
            log.error("request failed: %s %s: %s: %s", method, path, e.code, e.message)
            return self._error(500, e.code, e.message, html=html)
        except Exception:
            log.exception("request failed: %s %s", method, path)
            return self._error(500, api.INTERNAL, "internal error; see the server log", html=html)

    def _route(
        self, path: str, query: Mapping[str, Sequence[str]], who: tenants.Principal = tenants.OPERATOR_PRINCIPAL
    ) -> Response:
        if path == api.PREFIX or path.startswith(api.PREFIX + "/"):
            ctx = self.ctx if who.tenant is None else api.Context(self.ctx.pool, self.ctx.capacity, who)
            return json_response(200, api.handle(ctx, path, query))
        if path == "/readyz":
            ok, doc = self.readiness()
            return json_response(200 if ok else 503, doc)
        if path == "/metrics":
            return Response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if path == "/":
            return self._html(self.dashboard.fleet(query))
        for prefix, page in (("/nodes/", self.dashboard.node), ("/allocations/", self.dashboard.allocation)):
            if path.startswith(prefix) and len(path) > len(prefix) and "/" not in path[len(prefix) :]:
                return self._html(page(path[len(prefix) :]))
        raise api.ApiError(404, api.ROUTE_NOT_FOUND, f"no such page: {path}")

    def _schema_applied(self) -> bool:
        from reconciler.store import migrations

        try:
            with self.pool.reading() as conn:
                return bool(migrations.applied(conn))
        except GpuaasError:
            return True  # cannot tell: report the original error

    def _html(self, text: str) -> Response:
        return Response(200, text.encode(), "text/html; charset=utf-8", _HTML_HEADERS)

    def _error(
        self, status: int, code: str, message: str, *, html: bool, headers: Sequence[tuple[str, str]] = ()
    ) -> Response:
        if html and status != 401:
            try:
                page = self.dashboard.error(status, code, message)
                return Response(status, page.encode(), "text/html; charset=utf-8", (*_HTML_HEADERS, *headers))
            except Exception:  # the error page itself failed: fall back to JSON
                log.exception("error page failed")
        return json_response(status, api.error_body(code, message), headers)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        from reconciler.store import history, migrations

        checks: dict[str, Any] = {"database": False}
        try:
            with self.pool.reading() as conn:
                checks["database"] = True
                if not migrations.applied(conn):
                    return False, _not_ready(checks, reconciler_codes.READY_NO_SCHEMA, "the database has no schema yet")
                health = history.health(conn)
                row = conn.execute("SELECT now()").fetchone()
        except GpuaasError as e:
            return False, _not_ready(checks, reconciler_codes.READY_DB_UNREACHABLE, f"{e.code}: {e.message}")
        now = row[0] if row else dt.datetime.now(dt.UTC)
        checks["last_applied_revision"] = health.last_applied_revision
        checks["last_applied_at"] = health.last_applied_at
        limit = self.settings.max_reconcile_age_s
        if limit > 0:
            if health.last_applied_at is None:
                return False, _not_ready(
                    checks, reconciler_codes.READY_NEVER_RECONCILED, "no reconciliation has succeeded yet"
                )
            age = (now - health.last_applied_at).total_seconds()
            checks["last_applied_age_s"] = round(age, 3)
            if age > limit:
                return False, _not_ready(
                    checks,
                    reconciler_codes.READY_RECONCILIATION_STALE,
                    f"the newest successful reconciliation finished {age:.0f}s ago "
                    f"(over --max-reconcile-age {limit:g}s)",
                )
        problem = readiness.failing_check(health, now, self.settings.failing_grace_s, checks) or readiness.head_check(
            health, now, self.settings.head_grace_s, checks
        )
        if problem is not None:
            return False, _not_ready(checks, *problem)
        return True, {"ready": True, "checks": checks}


def _not_ready(checks: dict[str, Any], code: str, message: str) -> dict[str, Any]:
    return {"ready": False, "checks": checks, **api.error_body(code, message)}


# --------------------------------------------------------------------- HTTP


class HTTPServer:
    """A bound socket and the uvicorn server that serves `service` on it (the caller runs `serve_forever`)."""

    def __init__(
        self, sock: socket.socket, service: Service, settings: Settings, console_app: asgi.ASGIApp | None = None
    ) -> None:
        from reconciler.service import agents

        self.service = service
        self.socket = sock
        self.gateway = agents.Gateway(service.url, pool_size=settings.agent_pool_size)
        service.gateway = self.gateway
        service.registry.register(agents.GatewayCollector(self.gateway))
        app = asgi.build(
            service,
            self.gateway,
            allowed_hosts=settings.hosts(),
            request_timeout_s=settings.request_timeout_s,
            console_app=console_app,
            connections=lambda: len(self._server.server_state.connections),
            max_connections=settings.max_connections,
        )
        config = uvicorn.Config(
            app,
            http=_protocol_with_header_deadline(settings.header_timeout_s),
            ws="websockets-sansio",
            loop="auto",
            lifespan="on",
            access_log=False,
            log_config=None,
            server_header=False,
            date_header=False,
            limit_concurrency=settings.max_connections,
            timeout_keep_alive=30,
            timeout_graceful_shutdown=5,
            backlog=4096,
        )
        self._server = _Uvicorn(config)
        self._done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}"

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._done.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[self.socket])
        if self._server.started is False and not self._server.should_exit:
            raise ServeError("the server did not start (see the log)", code=reconciler_codes.SERVE_START_FAILED)

    def shutdown(self) -> None:
        """Stop serving and wait until the requests in flight are done (waiting watches are answered now)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.gateway.closing)
                loop.call_soon_threadsafe(self.service.events.close)  # event streams end now
        self._server.should_exit = True
        self._done.wait(30)

    def server_close(self) -> None:
        self.socket.close()


def make_server(url: str, settings: Settings) -> HTTPServer:
    """Bind (the caller runs `serve_forever` and, at the end, `shutdown` and `server_close`)."""
    settings.check()
    console_app = None
    if settings.console_credentials is not None:  # a bad credentials file stops startup before anything binds
        from reconciler.service import console

        console_app = console.app(console.gateway_from(url, settings.console_credentials, settings.console_libvirt_uri))
    service = Service(url, settings)
    try:
        sock = _bind(settings.host, settings.port)
    except OSError as e:
        service.close()
        raise ServeError(
            f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}",
            code=reconciler_codes.SERVE_LISTEN_FAILED,
        ) from e
    service.capacity.warm()
    return HTTPServer(sock, service, settings, console_app)
