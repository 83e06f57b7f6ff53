"""The host agent's only way to the control plane: HTTP(S) to `gpuaas serve`, as its node (schemas/agentwire.py).

    gpuaas host run --node NAME --service https://control:8080 --credential /etc/gpuaas/node.token

What the agent keeps doing when the service is away (restarted, network cut):

- it converges to the last plan it holds; it never tears down what runs
  because the control plane is silent (no plan is never read as an empty
  plan: only a plan the service sent can release a VM);
- it keeps its newest report of each kind and sends it when the service is
  back (an older one is worthless: the service ignores a report older than
  the one stored);
- it retries with exponential backoff and full jitter (0..min(cap, base*2^n)),
  so thousands of agents do not come back in one wave after a restart.

Between passes the agent waits on a plan watch (long-poll keyed by the
generation it holds): a new placement reaches the host in well under a
second, and an idle agent costs the service one open request.
"""

from __future__ import annotations

import logging
import random
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from host_reconciler import codes as host_codes
from schemas import agentwire, hostplans
from schemas.errors import PermanentError, TemporaryError, UsageError

log = logging.getLogger("gpuaas.host")

WATCH_CHUNK_S = 15.0  # the longest one watch request blocks (stop is noticed between chunks)


class ServiceUnreachable(TemporaryError):
    code = host_codes.SERVICE_UNREACHABLE


class ServiceRefused(PermanentError):
    code = host_codes.SERVICE_REFUSED


def load_credential(path: Path) -> str:
    """The node token in `path`; refused when group or others may read it (as ssh refuses such a key)."""
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"credential file {path} is not a regular file", code=host_codes.CREDENTIAL_INVALID)
        if st.st_mode & 0o077:
            raise UsageError(
                f"credential file {path} is accessible by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 {path}",
                code=host_codes.CREDENTIAL_PERMISSIONS,
            )
        with path.open("rb") as f:
            raw = f.read(1024)
    except OSError as e:
        raise UsageError(
            f"cannot read credential file {path}: {e.strerror or e}", code=host_codes.CREDENTIAL_UNREADABLE
        ) from e
    token = raw.decode("utf-8", "replace").strip()
    if not token.startswith(agentwire.TOKEN_PREFIX) or any(c.isspace() for c in token):
        raise UsageError(
            f"credential file {path} does not hold one node token ({agentwire.TOKEN_PREFIX}...; "
            "made by `gpuaas host token issue NODE --out FILE`)",
            code=host_codes.CREDENTIAL_INVALID,
        )
    return token


class Backoff:
    """Exponential backoff with full jitter; `reset` after a success."""

    def __init__(self, base: float = 0.5, cap: float = 30.0, rand: Callable[[], float] = random.random) -> None:
        self.base, self.cap, self._rand, self.failures = base, cap, rand, 0

    def next(self) -> float:
        self.failures += 1
        ceiling: float = min(self.cap, self.base * 2.0 ** min(self.failures, 20))
        return self._rand() * ceiling

    def reset(self) -> None:
        self.failures = 0


class AgentClient:
    """One node's session with the service: plan reads and watches, reports, heartbeats."""

    def __init__(
        self, base_url: str, node: str, token: str, *, verify: str | bool = True, timeout_s: float = 10.0
    ) -> None:
        self.node = node
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"),
            verify=verify,
            http2=False,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "gpuaas-host"},
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=False,
        )
        self._lock = threading.Lock()  # the heartbeat thread has its own client; this one is the loop's

    def close(self) -> None:
        self._client.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        try:
            with self._lock:
                resp = self._client.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
        except httpx.HTTPError as e:
            raise ServiceUnreachable(f"{method} {path}: {type(e).__name__}: {e}") from e
        if resp.status_code >= 500 or resp.status_code in (408, 421, 429):
            raise ServiceUnreachable(f"{method} {path}: HTTP {resp.status_code}: {_message(resp)}")
        if resp.status_code >= 400:
            raise ServiceRefused(f"{method} {path}: HTTP {resp.status_code}: {_message(resp)}")
        try:
            doc = resp.json()
        except ValueError as e:
            raise ServiceUnreachable(f"{method} {path}: the answer is not JSON") from e
        if not isinstance(doc, dict):
            raise ServiceUnreachable(f"{method} {path}: the answer is not a JSON object")
        return doc

    def plan(self, after: int | None = None, wait_s: float = 0.0) -> agentwire.PlanAnswer:
        params: dict[str, Any] = {}
        if after is not None:
            params = {"after": after, "wait": f"{min(wait_s, agentwire.MAX_WAIT_S):g}"}
        doc = self._call("GET", agentwire.plan_path(self.node), params=params, timeout=wait_s + 10.0)
        try:
            return agentwire.PlanAnswer.model_validate(doc)
        except ValueError as e:
            raise ServiceUnreachable(f"the plan answer does not decode: {e}") from e

    def report(self, kind: str, doc: dict[str, Any]) -> agentwire.ReportAnswer:
        return agentwire.ReportAnswer.model_validate(
            self._call("POST", agentwire.report_path(self.node, kind), json=doc)
        )

    def heartbeat(self) -> None:
        self._call("POST", agentwire.heartbeat_path(self.node))

    def rewipes(self) -> agentwire.RewipeRequests:
        return agentwire.RewipeRequests.model_validate(self._call("GET", agentwire.rewipes_path(self.node)))

    def answer_rewipe(self, request_id: int, state: str, answer: dict[str, Any]) -> None:
        self._call("POST", agentwire.rewipe_path(self.node, request_id), json={"state": state, "answer": answer})


def _message(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error") or {}
        return f"{err.get('code')}: {err.get('message')}"
    except (ValueError, AttributeError):
        return resp.text[:200]


def decode_plan(answer: agentwire.PlanAnswer, node: str) -> hostplans.HostPlan | None:
    if answer.plan is None:
        return None
    try:
        plan = hostplans.from_json(answer.plan)
    except (TypeError, KeyError, ValueError) as e:
        raise PermanentError(f"host plan of {node} does not decode: {e}", code=host_codes.PLAN_INVALID) from e
    if plan.node != node:
        raise PermanentError(f"the service sent a plan for {plan.node}, not {node}", code=host_codes.PLAN_WRONG_NODE)
    return plan


class ServiceSource:
    """The plan source and report sink of `host run` when it talks to the service (command.py)."""

    def __init__(self, base_url: str, node: str, token: str, *, verify: str | bool = True) -> None:
        self.node = node
        self.client = AgentClient(base_url, node, token, verify=verify)
        self._beat_client = AgentClient(base_url, node, token, verify=verify, timeout_s=5.0)
        self.held: hostplans.HostPlan | None = None  # the last plan the service sent
        self.generation = 0
        self._fresh = False  # a watch brought a plan the next pass has not used yet
        self.queued: dict[str, dict[str, Any]] = {}  # kind -> newest report not yet accepted
        self.backoff = Backoff()
        self.last_watch = -1e9  # when the newest watch request went out (monotonic)

    def plan(self) -> hostplans.HostPlan | None:
        """The plan to converge to: a fresh one from the service, or the one held when it cannot be reached."""
        if self._fresh:
            self._fresh = False
            return self.held
        try:
            answer = self.client.plan()
        except ServiceUnreachable as e:
            if self.held is None:
                raise
            log.warning(
                "service unreachable, converging to the plan held (generation %d): %s",
                self.generation,
                e.message,
                extra={"event": "host.service.unreachable", "generation": self.generation},
            )
            return self.held
        self._take(answer)
        return self.held

    def _take(self, answer: agentwire.PlanAnswer) -> None:
        plan = decode_plan(answer, self.node)
        if plan is not None:
            self.held, self.generation = plan, plan.generation

    def report(self, kind: str, doc: dict[str, Any]) -> None:
        self.queued[kind] = doc  # a newer report of a kind replaces the queued one
        self.flush()

    def flush(self) -> bool:
        for kind, doc in list(self.queued.items()):
            try:
                answer = self.client.report(kind, doc)
            except ServiceUnreachable as e:
                log.warning(
                    "%s report queued (service unreachable): %s",
                    kind,
                    e.message,
                    extra={"event": "host.report.queued", "kind": kind},
                )
                return False
            except ServiceRefused as e:  # a report the service will never take: do not resend it forever
                log.error("%s report refused: %s", kind, e.message, extra={"event": "host.report.refused"})
            else:
                if not answer.written:
                    log.info(
                        "%s report ignored: the service holds a newer one",
                        kind,
                        extra={"event": "host.report.stale", "kind": kind},
                    )
            if self.queued.get(kind) is doc:
                del self.queued[kind]
        return True

    def answer_rewipes(self, answer: Callable[[int], tuple[str, dict[str, Any]]]) -> None:
        """Answer this node's pending rewipe requests with `answer(slot)`; the service away: next pass."""
        try:
            pending = self.client.rewipes().requests
        except (ServiceUnreachable, ServiceRefused) as e:  # refused: a service older than this route
            log.warning("rewipe requests not read: %s", e.message, extra={"event": "host.rewipe.unread"})
            return
        for req in pending:
            outcome, detail = answer(req.slot_index)
            try:
                self.client.answer_rewipe(req.id, outcome, detail)
            except ServiceRefused as e:  # answered meanwhile (another agent for this node?): nothing to redo
                log.warning(
                    "rewipe request %d: answer refused: %s",
                    req.id,
                    e.message,
                    extra={"event": "host.rewipe.refused", "request": req.id},
                )
                continue
            log.info(
                "rewipe request %d for slot %d: %s",
                req.id,
                req.slot_index,
                outcome,
                extra={"event": "host.rewipe", "request": req.id, "slot": req.slot_index, "outcome": outcome},
            )

    def heartbeat(self) -> None:
        """A heartbeat request, unless a watch (which the service counts as one) went out within the period."""
        if time.monotonic() - self.last_watch < WATCH_CHUNK_S:
            return
        self._beat_client.heartbeat()

    def sleep(self, seconds: float, stop: threading.Event) -> None:
        """Wait up to `seconds` for a plan change (long-poll), sending queued reports first; back off on errors."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.queued and not self.flush():
                stop.wait(min(left, self.backoff.next()))
                continue
            try:
                self.last_watch = time.monotonic()
                answer = self.client.plan(after=self.generation, wait_s=min(left, WATCH_CHUNK_S))
            except ServiceUnreachable:
                stop.wait(min(left, self.backoff.next()))
                continue
            self.backoff.reset()
            if answer.changed:
                self._take(answer)
                self._fresh = True
                return

    def close(self) -> None:
        self.client.close()
        self._beat_client.close()
