"""The agent side of the service: node credentials, plan watches woken by LISTEN/NOTIFY, reports, heartbeats.

A host agent never holds a database connection; the service does the work
for it with a handful of connections, whatever the number of agents:

- **credentials**: a node token is looked up by its sha256 in
  `node_agent_tokens` (0060) and cached per process; a token change is
  NOTIFYed (`gpuaas_agent_token`) and every replica drops its cache.
- **identity per transaction**: every read or write for an agent runs in a
  transaction that takes `ROLE gpuaas_agent` with `gpuaas.agent_node` set to
  the authenticated node, so the database's row-level security still fences
  the node to its own rows whatever this code asks.
- **watches**: one listening connection per process (a thread) hears every
  plan write (`gpuaas_host_plan`, `node:generation`) and wakes the waiters of
  that node; a waiting agent costs a future, not a query. The last generation
  heard per node is kept, so a watch that asks for the generation already
  known waits without reading. When the listening connection is lost,
  notifications may have been missed: everything known is forgotten and every
  waiter re-reads.
- **heartbeats**: kept in a set and written once a second in one statement
  for all nodes (schemas/hostrows.py).

Nothing here lives only in this process: tokens, plans and reports are in
PostgreSQL, so any replica behind a load balancer answers any agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg_pool
from anyio import to_thread
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from psycopg.types.json import Jsonb

from reconciler.service import pool as pools
from reconciler.service.agenttokens import token_hash
from reconciler.service.batching import Batcher
from schemas import agentwire, dberrors, hostrows
from schemas.errors import GpuaasError, PermanentError, TemporaryError

log = logging.getLogger("gpuaas.serve.agents")

PLAN_CHANNEL = "gpuaas_host_plan"
TOKEN_CHANNEL = "gpuaas_agent_token"  # noqa: S105 - a channel name, not a secret


class GatewayCollector:
    """The agent API's own figures for /metrics (this process: each replica reports its own)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        g = self.gateway
        yield GaugeMetricFamily(
            "gpuaas_agent_watches_waiting", "Agent plan watches waiting in this process", value=g.waiting()
        )
        yield GaugeMetricFamily(
            "gpuaas_agent_notifications_listening",
            "1 while this process hears plan notifications (LISTEN connection up)",
            value=int(g.listening),
        )
        for name, help_text in (
            ("heartbeats", "Agent heartbeats received"),
            ("heartbeat_batches", "Heartbeat batches written"),
            ("reports", "Agent reports received"),
            ("reports_stale", "Agent reports ignored as older than the stored one"),
            ("plan_reads", "Plan reads for agents"),
            ("watch_wakeups", "Watches woken by a plan notification"),
        ):
            yield CounterMetricFamily(f"gpuaas_agent_{name}", help_text, value=g.counts[name])


class ReportInvalid(PermanentError):
    code = agentwire.REPORT_INVALID


class RewipeNotFound(PermanentError):
    code = agentwire.REWIPE_NOT_FOUND


class RewipeAnswered(PermanentError):
    code = agentwire.REWIPE_ANSWERED


@dataclass(frozen=True, slots=True)
class PlanRead:
    generation: int  # 0: no plan
    plan: dict[str, Any] | None


def _as_node(conn: psycopg.Connection[Any], node: str) -> None:
    """Take the agent identity for the rest of this transaction (row-level security keys on it)."""
    conn.execute("SELECT set_config('role', 'gpuaas_agent', true), set_config('gpuaas.agent_node', %s, true)", (node,))


# A report kind is a writer: (connection inside the node's transaction, node, document) -> written?
Writer = Callable[[psycopg.Connection[Any], str, Mapping[str, Any]], bool]


def _write_status(conn: psycopg.Connection[Any], node: str, doc: Mapping[str, Any]) -> bool:
    from pydantic import ValidationError

    try:
        report = agentwire.StatusReport.model_validate(doc)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(document)"
        raise ReportInvalid(f"status report: {where}: {first['msg']}") from None
    if report.node != node:
        raise ReportInvalid(f"status report names node {report.node!r}, not {node!r}")
    return hostrows.write_status(conn, report.model_dump(mode="json"))


WRITERS: dict[str, Writer] = {"status": _write_status}


class Gateway:
    def __init__(self, url: str, *, pool_size: int = 6, flush_s: float = 1.0, token_ttl_s: float = 300.0) -> None:
        self._url = url
        kwargs = pools.session_kwargs(
            url, read_only=False, statement_timeout_ms=30_000, connect_timeout=5, application_name="gpuaas-serve-agents"
        )
        self._listen_kwargs = {**kwargs, "application_name": "gpuaas-serve-listen"}
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] = psycopg_pool.ConnectionPool(
            url,
            min_size=0,
            max_size=max(1, pool_size),
            kwargs=kwargs,
            open=True,
            timeout=10.0,
            check=psycopg_pool.ConnectionPool.check_connection,
            name="gpuaas-serve-agents",
            max_idle=300.0,
        )
        self._flush_s = flush_s
        self._token_ttl_s = token_ttl_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._known: dict[str, int] = {}  # node -> newest plan generation heard or read
        self._beats: set[str] = set()
        self._tokens: dict[str, tuple[str, float]] = {}  # token sha256 -> (node, valid until, monotonic)
        self._lookups: Batcher[str | None] = Batcher(self._lookup)
        self._plan_reads: Batcher[PlanRead] = Batcher(self._read_plans)
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.listening = False
        self.counts = {
            "heartbeats": 0,
            "heartbeat_batches": 0,
            "reports": 0,
            "reports_stale": 0,
            "plan_reads": 0,
            "notifications": 0,
            "watch_wakeups": 0,
        }

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._listener = threading.Thread(target=self._listen, name="gpuaas-serve-listen", daemon=True)
        self._listener.start()
        self._flusher = asyncio.create_task(self._flush_loop())

    def wake_all(self) -> None:
        """Answer every waiting watch now (shutdown, or notifications may have been missed). Loop thread only."""
        waiters, self._waiters = self._waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)

    def closing(self) -> None:
        """The server is shutting down: answer every watch now, and new ones at once. Loop thread only."""
        self._stop.set()
        self.wake_all()

    async def stop(self) -> None:
        self._stop.set()
        self.wake_all()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        with contextlib.suppress(GpuaasError):
            await self._flush()
        if self._listener is not None:
            await to_thread.run_sync(self._listener.join, 5.0)
        await to_thread.run_sync(self._pool.close, 5.0)

    # --------------------------------------------------------- credentials

    def cached_node(self, token: str) -> str | None:
        """The node of a token authenticated lately (None: not cached; `authenticate` decides)."""
        hit = self._tokens.get(token_hash(token))
        return hit[0] if hit is not None and hit[1] > time.monotonic() else None

    async def authenticate(self, token: str) -> str | None:
        """The node this token belongs to, or None."""
        if not token.startswith(agentwire.TOKEN_PREFIX) or len(token) > 256:
            return None
        digest = token_hash(token)
        hit = self._tokens.get(digest)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0]
        node = await self._lookups.get(digest)
        if node is not None:
            self._tokens[digest] = (node, now + self._token_ttl_s)
        return node

    def _lookup(self, digests: list[str]) -> dict[str, str]:
        with self._connection("authenticate agents") as conn:
            rows = conn.execute(
                "SELECT token_sha256, node_name FROM node_agent_tokens WHERE token_sha256 = ANY(%s)", (digests,)
            ).fetchall()
        return {str(r[0]): str(r[1]) for r in rows}

    @contextlib.contextmanager
    def _connection(self, doing: str) -> Any:
        # The pool's own errors too (a timeout, a pool closed by shutdown): 503 and a retry, never a 500.
        with dberrors.wrapped(doing), self._pool.connection() as conn:
            yield conn

    # ------------------------------------------------------------- plans

    def _read_plans(self, nodes: list[str]) -> dict[str, PlanRead]:
        """Many nodes' plans in one transaction, each statement as its node (pipelined: one round trip)."""
        with self._connection(f"read the plans of {len(nodes)} node(s)") as conn, conn.transaction():
            conn.execute("SELECT set_config('role', 'gpuaas_agent', true)")
            reads = []
            with conn.pipeline():
                for node in nodes:
                    conn.execute("SELECT set_config('gpuaas.agent_node', %s, true)", (node,))
                    cur = conn.cursor()
                    cur.execute("SELECT generation, spec FROM host_plans WHERE node_name = %s", (node,))
                    reads.append((node, cur))
            out: dict[str, PlanRead] = {}
            for node, cur in reads:
                row = cur.fetchone()
                if row is None:
                    out[node] = PlanRead(0, None)
                    continue
                doc = dict(row[1])
                doc["generation"] = int(row[0])
                doc.setdefault("node", node)
                out[node] = PlanRead(int(row[0]), doc)
        self.counts["plan_reads"] += len(nodes)
        return out

    async def plan(self, node: str, after: int | None, wait_s: float) -> agentwire.PlanAnswer:
        """The node's plan; with `after`, wait up to `wait_s` for a generation other than `after`."""
        deadline = time.monotonic() + wait_s
        while True:
            known = self._known.get(node)
            if after is None or known is None or known != after:
                read = await self._plan_reads.get(node)
                if self._known.get(node) == known:  # no newer notification arrived during the read
                    self._known[node] = read.generation
                if after is None or read.generation != after:
                    return agentwire.PlanAnswer(
                        node=node, generation=read.generation or None, changed=True, plan=read.plan
                    )
                if self._known.get(node) != after:
                    continue  # a notification came in while reading: read again
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                return agentwire.PlanAnswer(node=node, generation=after or None, changed=False, plan=None)
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.setdefault(node, set()).add(fut)
            try:
                await asyncio.wait_for(fut, left)
                self.counts["watch_wakeups"] += 1
            except TimeoutError:
                pass
            finally:
                futs = self._waiters.get(node)
                if futs is not None:
                    futs.discard(fut)
                    if not futs:
                        del self._waiters[node]

    def waiting(self) -> int:
        return sum(len(f) for f in self._waiters.values())

    def _heard(self, channel: str, payload: str) -> None:  # on the loop thread
        self.counts["notifications"] += 1
        if channel == TOKEN_CHANNEL:
            self._tokens.clear()
            return
        node, _, gen = payload.rpartition(":")
        try:
            self._known[node] = int(gen)
        except ValueError:
            self._known.pop(node, None)
        for fut in self._waiters.pop(node, ()):
            if not fut.done():
                fut.set_result(None)

    def _resync(self) -> None:  # on the loop thread: notifications may have been missed
        self._known.clear()
        self._tokens.clear()
        self.wake_all()

    def _listen(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._url, **self._listen_kwargs) as conn:
                    conn.execute(f"LISTEN {PLAN_CHANNEL}")
                    conn.execute(f"LISTEN {TOKEN_CHANNEL}")
                    self._call(self._resync)
                    self.listening, delay = True, 0.5
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=0.5):
                            self._call(self._heard, n.channel, n.payload)
            except psycopg.Error as e:
                if not self._stop.is_set():
                    log.warning(
                        "plan notifications lost (%s); reconnecting in %.1fs",
                        e,
                        delay,
                        extra={"event": "serve.listen.lost"},
                    )
            finally:
                self.listening = False
            self._stop.wait(delay)
            delay = min(delay * 2, 10.0)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(fn, *args)

    # ----------------------------------------------------------- reports

    async def report(self, node: str, kind: str, doc: Mapping[str, Any]) -> agentwire.ReportAnswer:
        writer = WRITERS[kind]
        written = await to_thread.run_sync(self._write, node, writer, doc)
        self.counts["reports"] += 1
        if not written:
            self.counts["reports_stale"] += 1
        gen = doc.get("observed_generation")
        return agentwire.ReportAnswer(
            node=node, kind=kind, written=written, stored_generation=gen if isinstance(gen, int) and written else None
        )

    def _write(self, node: str, writer: Writer, doc: Mapping[str, Any]) -> bool:
        try:
            with self._connection(f"write a report of {node}") as conn, conn.transaction():
                _as_node(conn, node)
                return writer(conn, node, doc)
        except ReportInvalid:
            raise
        except TemporaryError:
            raise
        except GpuaasError as e:  # the database refused the report's contents (0008's checks)
            raise ReportInvalid(e.message) from e

    # ----------------------------------------------------------- rewipes

    async def rewipes(self, node: str) -> agentwire.RewipeRequests:
        return await to_thread.run_sync(self._read_rewipes, node)

    def _read_rewipes(self, node: str) -> agentwire.RewipeRequests:
        with self._connection(f"read the rewipe requests of {node}") as conn, conn.transaction():
            _as_node(conn, node)
            rows = conn.execute(
                "SELECT id, slot_index FROM slot_rewipe_requests WHERE node_name = %s"
                " AND state = 'pending' ORDER BY id",
                (node,),
            ).fetchall()
        return agentwire.RewipeRequests(
            node=node, requests=[agentwire.RewipeRequest(id=int(r[0]), slot_index=int(r[1])) for r in rows]
        )

    async def answer_rewipe(
        self, node: str, request_id: int, answer: agentwire.RewipeAnswer
    ) -> agentwire.RewipeAnswered:
        return await to_thread.run_sync(self._answer_rewipe, node, request_id, answer)

    def _answer_rewipe(self, node: str, request_id: int, answer: agentwire.RewipeAnswer) -> agentwire.RewipeAnswered:
        # As the node: another node's request is invisible (row-level security), so it is "not found", never written.
        with self._connection(f"answer rewipe request {request_id} of {node}") as conn, conn.transaction():
            _as_node(conn, node)
            row = conn.execute(
                "UPDATE slot_rewipe_requests SET state = %s, answered_at = now(), answer = %s"
                " WHERE id = %s AND state = 'pending' RETURNING id",
                (answer.state, Jsonb(answer.answer), request_id),
            ).fetchone()
            if row is None:
                seen = conn.execute("SELECT state FROM slot_rewipe_requests WHERE id = %s", (request_id,)).fetchone()
                if seen is None:
                    raise RewipeNotFound(f"no rewipe request {request_id} for node {node}")
                raise RewipeAnswered(f"rewipe request {request_id} was answered already ({seen[0]})")
        return agentwire.RewipeAnswered(node=node, id=request_id, state=answer.state)

    # -------------------------------------------------------- heartbeats

    def heartbeat(self, node: str) -> None:
        self._beats.add(node)
        self.counts["heartbeats"] += 1

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._flush_s)
            try:
                await self._flush()
            except GpuaasError as e:
                log.warning(
                    "heartbeats not written: %s: %s",
                    e.code,
                    e.message,
                    extra={"event": "serve.heartbeat.failed", "code": e.code},
                )

    async def _flush(self) -> None:
        if not self._beats:
            return
        nodes, self._beats = self._beats, set()
        try:
            await to_thread.run_sync(self._write_beats, sorted(nodes))
        except GpuaasError:
            self._beats |= nodes  # written with the next batch
            raise
        self.counts["heartbeat_batches"] += 1

    def _write_beats(self, nodes: list[str]) -> None:
        with self._connection("write heartbeats") as conn:
            hostrows.heartbeat(conn, nodes)
