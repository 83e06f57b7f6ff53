"""The console gateway: a slice VM's serial console over an authenticated, audited WebSocket.

    client ──WebSocket /api/v1/allocations/{id}/console──▶ gpuaas serve ──libvirt──▶ node: the VM's serial console

- The client presents a bearer token (`Authorization: Bearer <token>`, or the
  subprotocol `bearer.<token>` beside `gpuaas.console` for browsers, which
  cannot set headers on a WebSocket). A tenant's credential opens only its
  own tenant's allocations; an operator's opens any (`consoleauth`). No
  credential, an unknown one, or another tenant's allocation: the handshake is
  refused with HTTP 403, and the attempt is audited. So is a tenant naming an
  allocation that does not exist (403 too: no probing for ids).
- An allowed principal on an allocation that has no console to open (not a
  running slice VM: pending, released, baremetal) gets the WebSocket closed
  with 4409 and the reason; audited as refused. Baremetal: the provider's
  serial-over-LAN console is not offered yet.
- Every session is a row of `console_sessions` (migration 0059): who, when,
  which allocation and node, then its end, duration and bytes each way. The
  row is written before the handshake is accepted: no session runs unaudited.
- The session is cut (close 4410) when the allocation leaves provisioning and
  active (released, failed, placed elsewhere): a watcher re-reads it every
  `poll_s` seconds.
- Never a port on the node: the gateway reaches the node's libvirt over its
  management channel (`consolestreams.LibvirtConsoles`).

`routes(gateway)` gives the Starlette routes; `mount(app, gateway)` adds them
to an app (the lead wires it into `serve`'s ASGI app).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from reconciler.service.consoleauth import Credentials, Principal
from reconciler.service.consolestreams import ConsoleOpener, ConsoleStream, ConsoleUnavailable, LibvirtConsoles
from reconciler.store import connections
from schemas import dberrors
from schemas.errors import GpuaasError
from schemas.hostplans import vm_name

log = logging.getLogger("gpuaas.console")

PATH = "/api/v1/allocations/{allocation_id}/console"
SUBPROTOCOL = "gpuaas.console"
CLOSE_REFUSED = 4409  # allowed, but nothing to open (not a running slice VM)
CLOSE_CUT = 4410  # the allocation was released (or moved) while the session ran
CLOSE_FAILED = 4500  # the console stream failed
OPEN_STATES = frozenset({"provisioning", "active"})


@dataclass(frozen=True, slots=True)
class Target:
    tenant: str
    status: str
    shape: str | None
    node: str | None


class ConsoleGateway:
    def __init__(self, db_url: str, credentials: Credentials, opener: ConsoleOpener, *, poll_s: float = 2.0) -> None:
        self.db_url = db_url
        self.credentials = credentials
        self.opener = opener
        self.poll_s = poll_s

    # -- database (each call its own short connection, in a worker thread) ---------------------
    def _query(self, sql: str, params: tuple[Any, ...]) -> Any:
        with dberrors.wrapped("console audit"), connections.connect(self.db_url, autocommit=True) as conn:
            row = conn.execute(sql.encode(), params).fetchone()
            return row

    async def _target(self, allocation_id: str) -> Target | None:
        row = await asyncio.to_thread(
            self._query,
            "SELECT a.tenant, a.status, a.capacity_shape, n.name FROM allocations a"
            " LEFT JOIN nodes n ON n.id = a.node_id WHERE a.id = %s",
            (allocation_id,),
        )
        return Target(str(row[0]), str(row[1]), row[2], row[3]) if row else None

    async def _audit(
        self,
        allocation_id: str,
        who: Principal | None,
        remote: str,
        *,
        outcome: str,
        reason: str | None,
        node: str | None = None,
    ) -> int:
        row = await asyncio.to_thread(
            self._query,
            "INSERT INTO console_sessions (allocation_id, principal, role, tenant, node, remote, outcome, reason,"
            " closed_at, duration_ms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
            " CASE WHEN %s <> 'open' THEN now() END, CASE WHEN %s <> 'open' THEN 0 END) RETURNING id",
            (
                allocation_id,
                who.name if who else None,
                who.role.value if who else None,
                who.tenant if who else None,
                node,
                remote,
                outcome,
                reason,
                outcome,
                outcome,
            ),
        )
        return int(row[0])

    async def _finish(
        self, session: int, *, outcome: str, reason: str | None, started: float, bytes_in: int, bytes_out: int
    ) -> None:
        await asyncio.to_thread(
            self._query,
            "UPDATE console_sessions SET outcome = %s, reason = %s, closed_at = now(), duration_ms = %s,"
            " bytes_in = %s, bytes_out = %s WHERE id = %s RETURNING id",
            (outcome, reason, int((time.monotonic() - started) * 1000), bytes_in, bytes_out, session),
        )

    # -- the route -----------------------------------------------------------------------------
    async def endpoint(self, websocket: WebSocket) -> None:
        allocation_id = str(websocket.path_params["allocation_id"])
        remote = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else ""
        token, subprotocol = _token(websocket)
        who = self.credentials.lookup(token)
        target = await self._target(allocation_id) if who is not None else None
        if (
            who is None
            or (target is None and not who.may_open(""))
            or (target is not None and not who.may_open(target.tenant))
        ):
            why = (
                "no credential"
                if token is None
                else "unknown credential"
                if who is None
                else "not this tenant's allocation"
            )
            await self._audit(allocation_id, who, remote, outcome="refused", reason=why)
            await websocket.close(code=1008)  # before accept: the client sees HTTP 403
            return
        why_not = _why_not(target)
        if why_not is not None or target is None or target.node is None:
            await self._audit(
                allocation_id, who, remote, outcome="refused", reason=why_not, node=target.node if target else None
            )
            await websocket.accept(subprotocol)
            await websocket.close(code=CLOSE_REFUSED, reason=(why_not or "")[:120])
            return
        try:
            stream = await self.opener.open(target.node, vm_name(allocation_id))
        except GpuaasError as e:
            await self._audit(
                allocation_id, who, remote, outcome="failed", reason=f"{e.code}: {e.message}", node=target.node
            )
            await websocket.accept(subprotocol)
            await websocket.close(code=CLOSE_FAILED, reason=e.code)
            return
        try:
            session = await self._audit(allocation_id, who, remote, outcome="open", reason=None, node=target.node)
        except BaseException:
            stream.close()
            raise
        await websocket.accept(subprotocol)
        log.info("console %s opened by %s (%s) from %s", allocation_id, who.name, who.role, remote)
        await self._run(websocket, stream, session, allocation_id, target)

    async def _run(
        self, websocket: WebSocket, stream: ConsoleStream, session: int, allocation_id: str, target: Target
    ) -> None:
        started = time.monotonic()
        counts = {"in": 0, "out": 0}

        async def to_client() -> str:
            while True:
                data = await stream.read()
                if not data:
                    return "closed:console ended"
                counts["out"] += len(data)
                try:
                    await websocket.send_bytes(data)
                except (WebSocketDisconnect, OSError, RuntimeError):
                    return "closed:client left"  # it went away while the console was printing

        async def to_console() -> str:
            while True:
                try:
                    msg = await websocket.receive()
                except WebSocketDisconnect:
                    return "closed:client left"
                if msg["type"] == "websocket.disconnect":
                    return "closed:client left"
                data = msg.get("bytes") or (msg.get("text") or "").encode()
                if data:
                    counts["in"] += len(data)
                    await stream.write(data)

        async def watch() -> str:
            while True:
                await asyncio.sleep(self.poll_s)
                now = await self._target(allocation_id)
                if now is None or now.status not in OPEN_STATES or now.node != target.node:
                    return f"cut:allocation is {now.status if now else 'gone'}"

        tasks = [asyncio.create_task(t()) for t in (to_client, to_console, watch)]
        outcome, reason = "failed", "console stream failed"
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            first = next(iter(done))
            if first.exception() is None:
                outcome, _, reason = first.result().partition(":")
            else:
                reason = f"{type(first.exception()).__name__}: {first.exception()}"
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            stream.close()
            try:  # the audit row is final before the client hears the close
                await self._finish(
                    session,
                    outcome=outcome,
                    reason=reason,
                    started=started,
                    bytes_in=counts["in"],
                    bytes_out=counts["out"],
                )
            finally:
                code = {"cut": CLOSE_CUT, "failed": CLOSE_FAILED}.get(outcome, 1000)
                with contextlib.suppress(Exception):
                    await websocket.close(code=code, reason=reason[:120])
            log.info(
                "console %s %s (%s): %d bytes in, %d out", allocation_id, outcome, reason, counts["in"], counts["out"]
            )


def _token(websocket: WebSocket) -> tuple[str | None, str | None]:
    """The bearer token, and the subprotocol to answer with (when the client offered ours)."""
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    subprotocol = SUBPROTOCOL if SUBPROTOCOL in offered else None
    auth = websocket.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), subprotocol
    carried = next((p.removeprefix("bearer.") for p in offered if p.startswith("bearer.")), None)
    return carried or None, subprotocol


def _why_not(target: Target | None) -> str | None:
    if target is None:
        return "no such allocation"
    if target.shape == "baremetal":
        return "baremetal: the provider's serial-over-LAN console is not offered yet"
    if target.status not in OPEN_STATES or target.node is None:
        return f"allocation is {target.status}: no VM console to open"
    return None


def gateway_from(
    db_url: str, credentials_file: Path, libvirt_uri_template: str, *, poll_s: float = 2.0
) -> ConsoleGateway:
    """The gateway `serve` mounts: credentials from their file (mode 0600), consoles over libvirt.

    `libvirt_uri_template` names each node's libvirt, `{node}` replaced by the
    node name, e.g. `qemu+ssh://gpuaas@{node}/system` or `qemu+tls://{node}/system`.
    """
    return ConsoleGateway(
        db_url, Credentials.load(credentials_file), LibvirtConsoles(libvirt_uri_template), poll_s=poll_s
    )


def routes(gateway: ConsoleGateway) -> list[WebSocketRoute]:
    return [WebSocketRoute(PATH, gateway.endpoint)]


def mount(app: Starlette, gateway: ConsoleGateway) -> None:
    """Add the console route to `app` (serve's ASGI app)."""
    app.router.routes.extend(routes(gateway))


def app(gateway: ConsoleGateway) -> Starlette:
    """A Starlette app serving only the console (tests, or a gateway run on its own)."""
    return Starlette(routes=routes(gateway))


__all__ = ["ConsoleGateway", "ConsoleUnavailable", "app", "gateway_from", "mount", "routes"]
