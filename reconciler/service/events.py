"""`GET /api/v1/events`: allocation state changes as server-sent events, fed from the outbox, resumable.

Every state change the store makes is an outbox row written in the same
transaction (placement -> `provisioning.requested`, release, failure, the
pending deadline); its `id` is the SSE event id. A client that reconnects
with `Last-Event-ID: N` (or `?after=N`) gets every event after N, in order,
so it misses nothing; without either it starts at the newest event (only
what happens from now on; `?after=0` replays everything kept). A tenant
token gets only its tenant's allocations' events.

One hub per process polls the outbox's newest id (`POLL_S`, one cheap
indexed query) and wakes the streams, which each read their own rows
through the read-only pool. A stream ends after `MAX_STREAM_S` (the client
reconnects with its last id; the `retry:` hint says how soon) and sends a
comment every `KEEPALIVE_S` so proxies keep it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from anyio import to_thread
from psycopg.rows import dict_row

from reconciler.service import api, tenants
from schemas import dberrors
from schemas.errors import GpuaasError

if TYPE_CHECKING:
    from reconciler.service import asgi, server
    from reconciler.service.pool import Pool

log = logging.getLogger("gpuaas.serve.events")

PATH = f"{api.PREFIX}/events"
POLL_S = 0.25
KEEPALIVE_S = 15.0
MAX_STREAM_S = 300.0
BATCH = 500

# The allocation state an outbox event announces (None: an event without one state, e.g. a failed attempt retried).
STATES = {
    "provisioning.requested": "reserved",
    "release.requested": "releasing",
    "allocation.released": "released",
    "allocation.failed": "failed",
}


def state_of(event_type: str, payload: dict[str, Any]) -> str | None:
    if event_type == "provisioning.failed":
        return "pending" if payload.get("next") == "reschedule" else "failed"
    return STATES.get(event_type)


def read_after(pool: Pool, after: int, tenant: str | None, limit: int = BATCH) -> list[dict[str, Any]]:
    """Outbox events of allocations after id `after`, oldest first (a tenant's only, when given)."""
    where = "o.id > %s AND o.aggregate_type = 'allocation'" + (" AND a.tenant = %s" if tenant else "")
    params: tuple[Any, ...] = (after, tenant, limit) if tenant else (after, limit)
    with pool.reading() as conn, dberrors.wrapped("read the event stream"):
        rows = (
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT o.id, o.event_type, o.aggregate_id, o.payload, o.created_at, a.tenant FROM outbox o"  # noqa: S608
                f" LEFT JOIN allocations a ON a.id = o.aggregate_id WHERE {where} ORDER BY o.id LIMIT %s",
                params,
            )
            .fetchall()
        )
    return [
        {
            "outbox_id": r["id"],
            "event_type": r["event_type"],
            "allocation_id": r["aggregate_id"],
            "tenant": r["tenant"],
            "state": state_of(r["event_type"], r["payload"] or {}),
            "at": r["created_at"].isoformat(),
            "payload": r["payload"] or {},
        }
        for r in rows
    ]


def newest(pool: Pool) -> int:
    with pool.reading() as conn, dberrors.wrapped("read the newest event id"):
        row = conn.execute("SELECT coalesce(max(id), 0) FROM outbox").fetchone()
    return int(row[0]) if row else 0


def frame(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, default=str, separators=(",", ":"))
    return f"id: {event['outbox_id']}\nevent: {event['event_type']}\ndata: {data}\n\n".encode()


class Hub:
    """Wakes every open stream when the outbox grew (one poll per process, not per client)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.head = -1
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.closed = False
        self.streams = 0

    def _ensure(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll(), name="gpuaas-events-poll")
        return self._changed

    async def _poll(self) -> None:
        while not self.closed and self.streams > 0:
            try:
                head = await to_thread.run_sync(newest, self.pool)
            except GpuaasError as e:
                log.warning("event poll failed: %s", e.message, extra={"event": "serve.events.poll_failed"})
                head = self.head
            if head != self.head and self._changed is not None:
                self.head = head
                self._changed.set()
                self._changed = asyncio.Event()
            await asyncio.sleep(POLL_S)

    async def wait(self, timeout: float) -> None:
        changed = self._ensure()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)

    def close(self) -> None:
        self.closed = True
        if self._changed is not None:
            self._changed.set()


def _resume_id(scope: asgi.Scope) -> int | None:
    from urllib.parse import parse_qs

    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    given = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"last-event-id"), None)
    text = given if given is not None else (query.get("after") or [None])[-1]
    if text is None:
        return None
    if not text.strip().isdigit():
        raise api.ApiError(400, api.BAD_REQUEST, f"Last-Event-ID / after must be an event id, not {text[:40]!r}")
    return int(text)


async def stream(service: server.Service, hub: Hub, scope: asgi.Scope, receive: asgi.Receive, send: asgi.Send) -> None:
    from reconciler.service import portal

    auth = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"authorization"), "")
    try:
        who: tenants.Principal = service.principal({"Authorization": auth})
        after = _resume_id(scope)
        if after is None:
            after = await to_thread.run_sync(newest, service.pool)
    except api.ApiError as e:
        await portal.send_json(send, e.status, api.error_body(e.code, e.message), e.headers)
        return
    except GpuaasError as e:
        await portal.send_json(send, 503, api.error_body(api.DB_UNAVAILABLE, e.message), (("Retry-After", "1"),))
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-store"),
                (b"x-accel-buffering", b"no"),
            ],
        }
    )
    gone = asyncio.Event()

    async def watch_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    watcher = asyncio.get_running_loop().create_task(watch_disconnect())
    hub.streams += 1
    started = last_sent = time.monotonic()
    try:
        await send(
            {
                "type": "http.response.body",
                "body": b"retry: 1000\n: stream from event " + str(after).encode() + b"\n\n",
                "more_body": True,
            }
        )
        while not gone.is_set() and not hub.closed and time.monotonic() - started < MAX_STREAM_S:
            seen = hub.head  # a wake-up between this read and the wait below is not lost
            try:
                events = await to_thread.run_sync(read_after, service.pool, after, who.tenant)
            except GpuaasError as e:
                log.warning("event stream read failed: %s", e.message, extra={"event": "serve.events.read_failed"})
                events = []
            if events:
                after = int(events[-1]["outbox_id"])
                await send(
                    {"type": "http.response.body", "body": b"".join(frame(e) for e in events), "more_body": True}
                )
                last_sent = time.monotonic()
                if len(events) == BATCH:
                    continue  # more are waiting: no need to wait for a wake-up
            elif time.monotonic() - last_sent >= KEEPALIVE_S:
                await send({"type": "http.response.body", "body": b": keepalive\n\n", "more_body": True})
                last_sent = time.monotonic()
            if not gone.is_set() and hub.head == seen:
                await hub.wait(min(KEEPALIVE_S, 1.0))
        if not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:
        pass  # the client went away mid-write
    finally:
        hub.streams -= 1
        watcher.cancel()
