"""Webhooks: every allocation event of the outbox POSTed, signed, to the portal; retried, then dead-lettered.

`serve --webhook URL --webhook-secret-file FILE` starts one delivery thread.
It reads the outbox after its cursor (`portal_webhook_cursors`, migration
0081, so a restart resumes where it stopped), in order, and POSTs each event
(the same JSON as the SSE stream's `data:`) with:

- `X-Gpuaas-Event-Id: <outbox id>` (the receiver's dedupe key: delivery is
  at least once),
- `X-Gpuaas-Signature: t=<unix seconds>,v1=<hex hmac-sha256(secret, "<t>.<body>")>`
  (check it, and reject an old `t`, to refuse forged or replayed calls).

A 2xx answer delivers. Anything else (a refused connection, a timeout, 5xx,
4xx) is retried with exponential backoff (`backoff_s`, doubling, at most
`max_attempts` tries); then the event goes to `portal_webhook_dead_letters`
with the last status and error, and delivery moves on (one bad event never
blocks the rest). Several replicas may run it: a session advisory lock per
URL lets one deliver while the others wait.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.types.json import Jsonb

from reconciler import codes as reconciler_codes
from reconciler.service import events
from reconciler.service.pool import Pool, session_kwargs
from schemas.errors import GpuaasError, PermanentError

log = logging.getLogger("gpuaas.serve.webhooks")


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def load_secret(path: Path) -> bytes:
    try:
        st = path.stat()
        secret = path.read_bytes().strip()
    except OSError as e:
        raise PermanentError(
            f"cannot read webhook secret {path}: {e.strerror or e}",
            code=reconciler_codes.SERVE_WEBHOOK_SECRET_UNREADABLE,
        ) from e
    if st.st_mode & 0o077:
        raise PermanentError(
            f"webhook secret {path} is accessible by group or others; chmod 600 {path}",
            code=reconciler_codes.SERVE_WEBHOOK_SECRET_PERMISSIONS,
        )
    if len(secret) < 16:
        raise PermanentError(
            f"webhook secret {path} is shorter than 16 bytes", code=reconciler_codes.SERVE_WEBHOOK_SECRET_INVALID
        )
    return secret


class Deliverer:
    def __init__(
        self,
        db_url: str,
        pool: Pool,
        url: str,
        secret: bytes,
        *,
        max_attempts: int = 8,
        backoff_s: float = 1.0,
        timeout_s: float = 10.0,
        poll_s: float = 0.5,
    ) -> None:
        self.db_url, self.pool, self.url, self.secret = db_url, pool, url, secret
        self.max_attempts, self.backoff_s, self.timeout_s, self.poll_s = max_attempts, backoff_s, timeout_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuaas-webhooks", daemon=True)
        self.delivered = 0
        self.dead = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                kwargs = session_kwargs(
                    self.db_url,
                    read_only=False,
                    statement_timeout_ms=30_000,
                    connect_timeout=5,
                    application_name="gpuaas-serve-webhooks",
                )
                with psycopg.connect(self.db_url, **kwargs) as conn, httpx.Client(timeout=self.timeout_s) as client:
                    key = int(hashlib.sha256(self.url.encode()).hexdigest()[:15], 16)
                    while not self._stop.is_set():
                        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
                        if row and row[0]:
                            break
                        self._stop.wait(self.poll_s * 4)  # another replica delivers
                    self._deliver_all(conn, client)
            except (psycopg.Error, GpuaasError) as e:
                log.warning("webhook delivery paused: %s", e, extra={"event": "serve.webhook.paused"})
                self._stop.wait(2.0)

    def _deliver_all(self, conn: psycopg.Connection[Any], client: httpx.Client) -> None:
        conn.execute(
            "INSERT INTO portal_webhook_cursors (url, last_id) SELECT %s, coalesce(max(id), 0) FROM outbox"
            " ON CONFLICT (url) DO NOTHING",
            (self.url,),
        )  # a new webhook starts at the newest event
        while not self._stop.is_set():
            row = conn.execute("SELECT last_id FROM portal_webhook_cursors WHERE url = %s", (self.url,)).fetchone()
            after = int(row[0]) if row else 0
            batch = events.read_after(self.pool, after, None, limit=100)
            if not batch:
                self._stop.wait(self.poll_s)
                continue
            for event in batch:
                if self._stop.is_set():
                    return
                if not self._deliver(conn, client, event):
                    return  # stopping mid-retry: the cursor stays, the event is sent again after a restart
                conn.execute(
                    "UPDATE portal_webhook_cursors SET last_id = %s, updated_at = now() WHERE url = %s",
                    (event["outbox_id"], self.url),
                )

    def _deliver(self, conn: psycopg.Connection[Any], client: httpx.Client, event: dict[str, Any]) -> bool:
        """Deliver `event` or dead-letter it (True); False when stopping before either."""
        body = json.dumps(event, default=str, separators=(",", ":")).encode()
        status: int | None = None
        error = ""
        for attempt in range(1, self.max_attempts + 1):
            headers = {
                "Content-Type": "application/json",
                "X-Gpuaas-Event-Id": str(event["outbox_id"]),
                "X-Gpuaas-Event": str(event["event_type"]),
                "X-Gpuaas-Signature": signature(self.secret, int(time.time()), body),
            }
            try:
                resp = client.post(self.url, content=body, headers=headers)
                status, error = resp.status_code, resp.text[:300]
                if 200 <= resp.status_code < 300:
                    self.delivered += 1
                    return True
            except httpx.HTTPError as e:
                status, error = None, f"{type(e).__name__}: {e}"[:300]
            if attempt < self.max_attempts and self._stop.wait(min(self.backoff_s * 2 ** (attempt - 1), 300.0)):
                return False
        self.dead += 1
        log.error(
            "webhook %s: event %s dead-lettered after %d tries (%s %s)",
            self.url,
            event["outbox_id"],
            self.max_attempts,
            status,
            error,
            extra={"event": "serve.webhook.dead_letter"},
        )
        conn.execute(
            "INSERT INTO portal_webhook_dead_letters (url, outbox_id, attempts, last_status, last_error,"
            " payload) VALUES (%s, %s, %s, %s, %s, %s)",
            (self.url, event["outbox_id"], self.max_attempts, status, error, Jsonb(event)),
        )
        return True
