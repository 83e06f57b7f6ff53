"""The portal's write routes: POST /api/v1/allocations, DELETE /api/v1/allocations/{id} (intake.py does the work).

Authentication is the read side's (`Service.principal`): the operator token
may request for any tenant, a tenant token only for its own. The git and
database work is synchronous and serialized, so it runs in a worker thread;
the event loop keeps serving reads and agent watches meanwhile.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from anyio import to_thread
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from reconciler.service import api, intake

if TYPE_CHECKING:
    from reconciler.service import asgi, server

_ONE = re.compile(rf"^{api.PREFIX}/allocations/([A-Za-z0-9][A-Za-z0-9._:-]{{0,252}})$")
_MANY = f"{api.PREFIX}/allocations"
MAX_KEY = 255


def handles(scope: asgi.Scope) -> bool:
    """Whether this is a portal write (the read side answers everything else, 405 included)."""
    path = scope.get("path", "")
    method = scope.get("method")
    return (method == "POST" and path == _MANY) or (method == "DELETE" and _ONE.match(path) is not None)


def _header(scope: asgi.Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == name), None)


async def send_json(send: asgi.Send, status: int, doc: Any, extra: tuple[tuple[str, str], ...] = ()) -> None:
    body = json.dumps(doc, default=str, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *((k.encode(), v.encode()) for k, v in extra),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _body(receive: asgi.Receive) -> bytes | None:
    data = bytearray()
    while True:
        message = await receive()
        data += message.get("body", b"")
        if len(data) > intake.MAX_BODY:
            return None
        if not message.get("more_body"):
            return bytes(data)


async def handle(service: server.Service, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    work = service.intake
    if work is None:  # the read-only server of before: the same 405 and code
        await send_json(
            send,
            405,
            api.error_body(
                api.METHOD_NOT_ALLOWED,
                f"{scope['method']} is not allowed: this server is read-only (serve --intake-repo PATH takes requests)",
            ),
            (("Allow", "GET, HEAD"),),
        )
        return
    auth = _header(scope, b"authorization") or ""
    try:
        who = service.principal({"Authorization": auth})
    except api.ApiError as e:
        await send_json(send, e.status, api.error_body(e.code, e.message), e.headers)
        return
    key = _header(scope, b"idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_KEY:
        await send_json(send, 400, api.error_body(intake.BAD_BODY, f"Idempotency-Key must be 1-{MAX_KEY} characters"))
        return
    if scope["method"] == "POST":
        body = await _body(receive)
        if body is None:
            await send_json(
                send, 413, api.error_body(intake.BAD_BODY, f"a request body is at most {intake.MAX_BODY} bytes")
            )
            return
        answer = await to_thread.run_sync(work.create, who, body, key)
    else:
        m = _ONE.match(scope["path"])
        allocation_id = m.group(1) if m else ""
        answer = await to_thread.run_sync(work.release, who, allocation_id, key)
    extra: tuple[tuple[str, str], ...] = (("Idempotent-Replayed", "true"),) if answer.replayed else ()
    if answer.status == 202:
        extra += (("Location", str(answer.doc.get("location", ""))),)
    await send_json(send, answer.status, answer.doc, extra)


class PortalCollector:
    """The portal side's figures for /metrics (this process): intakes by status, event streams, webhooks."""

    def __init__(self, service: server.Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        s = self.service
        intakes = CounterMetricFamily(
            "gpuaas_portal_intakes", "Portal writes answered, by HTTP status", labels=["status"]
        )
        for status, n in sorted((s.intake.counts if s.intake else {}).items()):
            intakes.add_metric([str(status)], n)
        yield intakes
        yield GaugeMetricFamily("gpuaas_portal_event_streams", "Open /api/v1/events streams", value=s.events.streams)
        hooks = s.webhooks
        yield CounterMetricFamily(
            "gpuaas_portal_webhook_delivered", "Webhook events delivered (2xx)", value=hooks.delivered if hooks else 0
        )
        yield CounterMetricFamily(
            "gpuaas_portal_webhook_dead_letters",
            "Webhook events given up on after retries",
            value=hooks.dead if hooks else 0,
        )
