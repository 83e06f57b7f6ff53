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
import ipaddress
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from reconciler.service import api, asgi, capacities, dashboard, metrics, readiness, tenants
from reconciler.service.pool import Pool
from schemas import inputfiles
from schemas.errors import GpuaasError, PermanentError, TemporaryError, UsageError

if TYPE_CHECKING:
    from reconciler.service import agents, intake, webhooks

log = logging.getLogger("gpuaas.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
_HTML_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)


class ServeError(PermanentError):
    code = "serve.error"


# ------------------------------------------------------------ configuration


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT`, `:PORT` (loopback) or `PORT`."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"--listen takes HOST:PORT, not {text!r}", code="serve.listen_invalid") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"--listen port must be 0..65535, not {port}", code="serve.listen_invalid")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def load_token(path: Path) -> str:
    """The bearer token in `path`; refused when group or others may read it, or when it is empty."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ServeError(f"token file {path} is not a regular file", code="serve.token_file_invalid")
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise ServeError(
                f"token file {path} is accessible by group or others (mode {mode:04o}); chmod 600 {path}",
                code="serve.token_file_permissions",
            )
        # Bounded, regular file only, never quoted: a file named by mistake (a key, /dev/zero) is refused unread.
        try:
            token = inputfiles.read_text(
                path, limit=4 * inputfiles.KIB, code="serve.token_file_invalid", what="token file"
            ).strip()
        except PermanentError as e:
            raise ServeError(e.message, code=e.code) from e
    except OSError as e:
        raise ServeError(f"cannot read token file {path}: {e.strerror or e}", code="serve.token_file_unreadable") from e
    if not token or any(c.isspace() for c in token):
        raise ServeError(
            f"token file {path} must hold one token (no spaces), and not be empty", code="serve.token_file_invalid"
        )
    return token


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    max_reconcile_age_s: float = 0.0  # 0: not checked (an idle loop records no reconciliation)
    failing_grace_s: float = 300.0
    head_grace_s: float = 300.0  # /readyz: HEAD not applied this long (invalid, behind, failing) is not ready
    refresh_s: int = 15
    capacity_refresh_s: float = 10.0
    capacity_wait_s: float = 2.0
    policy: str | None = None
    pool_size: int = 8
    allowed_hosts: tuple[str, ...] = ()  # besides loopback names and the listen address; "*": any
    max_connections: int = 16384
    request_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    agent_pool_size: int = 6
    tenant_tokens: Path | None = None  # TENANT:SHA256 lines (tenants.py); re-read when the file changes
    intake_repo: Path | None = None  # the desired-state checkout POST /api/v1/allocations commits to
    intake_push: tuple[str, str] | None = None  # (remote, branch) the intake pushes to
    webhook_url: str | None = None  # every allocation event POSTed here, signed (webhooks.py)
    webhook_secret: Path | None = None
    webhook_backoff_s: float = 1.0
    console_credentials: Path | None = None  # None: no console gateway (the route answers 404)
    console_libvirt_uri: str = "qemu+ssh://gpuaas@{node}/system"

    def hosts(self) -> tuple[str, ...]:
        """The Host names answered: loopback names, the listen address (unless a wildcard), --allow-host."""
        own = () if self.host in ("0.0.0.0", "::", "") else (self.host,)  # noqa: S104 - comparing, not binding
        return (*asgi.LOOPBACK_NAMES, *own, *self.allowed_hosts)

    def check(self) -> None:
        if self.webhook_url is not None and self.webhook_secret is None:
            raise ServeError(
                "--webhook needs --webhook-secret-file (payloads are signed)", code="serve.webhook_secret_missing"
            )
        if not is_loopback(self.host) and self.token is None:
            raise ServeError(
                f"listening on {self.host} (not loopback) needs --token-file: every request but "
                "/healthz must then carry that bearer token",
                code="serve.listen_needs_token",
            )


# ----------------------------------------------------------------- service


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
        self.capacity = capacities.Cache(
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
            code = api.DB_UNAVAILABLE if e.code == "db.unavailable" else e.code
            return self._error(503, code, e.message, html=html, headers=retry)
        except GpuaasError as e:
            if e.code == "status.no_schema" or (e.code == "db.error" and not self._schema_applied()):
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
                    return False, _not_ready(checks, "ready.no_schema", "the database has no schema yet")
                health = history.health(conn)
                row = conn.execute("SELECT now()").fetchone()
        except GpuaasError as e:
            return False, _not_ready(checks, "ready.db_unreachable", f"{e.code}: {e.message}")
        now = row[0] if row else dt.datetime.now(dt.UTC)
        checks["last_applied_revision"] = health.last_applied_revision
        checks["last_applied_at"] = health.last_applied_at
        limit = self.settings.max_reconcile_age_s
        if limit > 0:
            if health.last_applied_at is None:
                return False, _not_ready(checks, "ready.never_reconciled", "no reconciliation has succeeded yet")
            age = (now - health.last_applied_at).total_seconds()
            checks["last_applied_age_s"] = round(age, 3)
            if age > limit:
                return False, _not_ready(
                    checks,
                    "ready.reconciliation_stale",
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


def _protocol_with_header_deadline(seconds: float) -> type[Any]:
    """uvicorn's HTTP protocol, plus: a request head not complete within `seconds` of its first byte is cut.

    uvicorn times out idle keep-alive connections but not a client that
    sends its head one byte at a time; the per-request `Deadline` (asgi.py)
    starts only once the head is in.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:  # httptools not installed: the pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as Base  # type: ignore[assignment]

    class Protocol(Base):
        _head_timer: asyncio.TimerHandle | None = None

        def data_received(self, data: bytes) -> None:
            if self._head_timer is None and seconds > 0:
                self._arm(self.cycle)
            super().data_received(data)

        def _arm(self, cycle: Any) -> None:
            def fire() -> None:
                self._head_timer = None
                if self.cycle is cycle and not self.transport.is_closing():  # no new request began meanwhile
                    self.transport.close()

            self._head_timer = self.loop.call_later(seconds, fire)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return Protocol


class _Uvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # `gpuaas serve` handles SIGTERM/SIGINT itself (schemas/signals.py)


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
            raise ServeError("the server did not start (see the log)", code="serve.start_failed")

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


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(4096)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


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
            f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}", code="serve.listen_failed"
        ) from e
    service.capacity.warm()
    return HTTPServer(sock, service, settings, console_app)


def token_from(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else load_token(Path(path))
