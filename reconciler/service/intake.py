"""Request intake: `POST /api/v1/allocations` and `DELETE /api/v1/allocations/{id}` commit to the desired-state repo.

The portal's request becomes `allocations/<id>.yaml` through exactly the code
`gpuaas request create --commit --push` runs (reconciler/reconcile/requests.py): the
whole repo is validated with the new file first (422 carries the problems
`gpuaas validate` would print, same codes and messages), the file is
committed by the bot and pushed; a refused push is rolled back there (no
half-written file, no stray local commit), then the checkout is brought up to
the remote and the request redone, a few times, so concurrent writers (other
replicas, people) never lose a commit.

Intakes are serialized: a lock in the process, and a PostgreSQL advisory
lock across replicas, held on the intake's own small write connection (the
service's read pool stays read-only). That connection also writes the two
tables of migration 0080: `portal_idempotency` (the first answer to a
principal's `Idempotency-Key`, replayed for the same key and body; another
body with the same key is 422 `intake.idempotency_key_reused`) and
`portal_audit` (who, what, which commit, every write and every refusal).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import git
import psycopg
from psycopg.types.json import Jsonb
from pydantic import ValidationError

from desired.reading import loading, safefiles
from reconciler import codes as reconciler_codes
from reconciler.reconcile import requests
from reconciler.service import tenants
from reconciler.service.pool import session_kwargs
from reconciler.service.portalmodels import Accepted, AllocationRequest
from schemas.errors import PermanentError

log = logging.getLogger("gpuaas.serve.intake")

LOCK_KEY = 0x67707561_01  # pg_advisory_lock key of the intake (any replica)
PUSH_ATTEMPTS = 8
MAX_BODY = 256 * 1024

BAD_BODY = reconciler_codes.INTAKE_BAD_REQUEST  # not JSON, or a field of the wrong type
INVALID = reconciler_codes.REQUEST_INVALID  # the repo would be invalid: problems as `gpuaas validate` prints them
EXISTS = reconciler_codes.INTAKE_EXISTS  # an allocation with this id is already in the repo
KEY_REUSED = reconciler_codes.INTAKE_IDEMPOTENCY_KEY_REUSED  # the same Idempotency-Key with another body
GIT_FAILED = reconciler_codes.INTAKE_GIT_FAILED  # commit or push failed after retries (nothing was left behind)
DB_FAILED = (
    reconciler_codes.INTAKE_DB_UNAVAILABLE
)  # the idempotency / audit store cannot be reached: nothing was written
TENANT_MISMATCH = reconciler_codes.INTAKE_TENANT_MISMATCH  # a tenant token asking for another tenant
RELEASED = reconciler_codes.INTAKE_ALREADY_RELEASED  # DELETE of an allocation whose file already says released
CODES = (BAD_BODY, INVALID, EXISTS, KEY_REUSED, RELEASED, GIT_FAILED, DB_FAILED, TENANT_MISMATCH)


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    doc: dict[str, Any]
    replayed: bool = False


def _error(status: int, code: str, message: str, **extra: Any) -> Answer:
    return Answer(status, {"error": {"code": code, "message": message, **extra}})


class Intake:
    def __init__(self, db_url: str, repo: Path, push: tuple[str, str] | None) -> None:
        self.db_url = db_url
        self.repo = repo
        self.push = push
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self.counts: dict[int, int] = {}  # answers by HTTP status, for /metrics

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------ entry points

    def create(self, who: tenants.Principal, body: bytes, key: str | None) -> Answer:
        try:
            raw = json.loads(body or b"null")
            req = AllocationRequest.model_validate(raw)
        except (ValueError, ValidationError) as e:
            return _error(400, BAD_BODY, f"the body is not an allocation request: {_short(e)}")
        if who.tenant is not None and req.tenant not in (None, who.tenant):
            return _error(
                403, TENANT_MISMATCH, f"this token is tenant {who.tenant}'s; it may not request for {req.tenant}"
            )
        tenant = who.tenant or req.tenant
        if tenant is None:
            return _error(400, BAD_BODY, "tenant is required with an operator token")
        req = req.model_copy(update={"tenant": tenant})
        return self._serialized(
            who,
            "create",
            allocation_id=req.id,
            key=key,
            fingerprint_doc=req.model_dump(mode="json"),
            work=lambda: self._create(req),
        )

    def release(self, who: tenants.Principal, allocation_id: str, key: str | None) -> Answer:
        return self._serialized(
            who,
            "release",
            allocation_id=allocation_id,
            key=key,
            fingerprint_doc={"release": allocation_id},
            work=lambda: self._release(who, allocation_id),
        )

    # -------------------------------------------------------------- the work

    def _create(self, req: AllocationRequest) -> tuple[Answer, str | None]:
        def attempt() -> requests.Written:
            return requests.create(
                self.repo,
                tenant=str(req.tenant),
                sku=req.sku,
                gpus=req.gpu_count,
                region=req.region,
                image=req.image,
                ssh_keys=list(req.ssh_keys),
                allocation_id=req.id,
                vm_profile=req.vm_profile,
                lease_hours=req.lease_hours,
                commit=True,
                push=self.push,
            )

        if req.id is not None and req.id in _allocations(self.repo):
            return _error(409, EXISTS, f"allocation {req.id!r} is already in the desired-state repo"), None
        return self._pushed(attempt, str(req.tenant), "present")

    def _release(self, who: tenants.Principal, allocation_id: str) -> tuple[Answer, str | None]:
        self._catch_up()
        found = _allocations(self.repo).get(allocation_id)
        if found is None or not who.may_see(found[0]):
            return _error(
                404, reconciler_codes.API_NOT_FOUND, f"no allocation {allocation_id!r} in the desired-state repo"
            ), None
        if found[1] == "released":
            return _error(409, RELEASED, f"allocation {allocation_id!r} is already released"), None
        return self._pushed(
            lambda: requests.release(self.repo, allocation_id, commit=True, push=self.push), found[0], "released"
        )

    def _pushed(self, attempt: Any, tenant: str, state: str) -> tuple[Answer, str | None]:
        """Run `attempt` (write, commit, push); on a refused push, catch up with the remote and redo it."""
        last: PermanentError | None = None
        for n in range(PUSH_ATTEMPTS):
            self._catch_up()
            try:
                written: requests.Written = attempt()
            except requests.RequestRejected as e:
                return _error(
                    422,
                    INVALID,
                    "the request would make the desired state invalid; nothing was written",
                    problems=[p.as_dict() for p in e.problems],
                ), None
            except PermanentError as e:
                if e.code == reconciler_codes.REQUEST_EXISTS:
                    return _error(409, EXISTS, e.message), None
                if e.code == reconciler_codes.REQUEST_NOT_FOUND:
                    return _error(404, reconciler_codes.API_NOT_FOUND, e.message), None
                if e.code not in (reconciler_codes.REQUEST_PUSH_REJECTED, reconciler_codes.REQUEST_GIT):
                    return _error(422, e.code, e.message), None
                last = e
                time.sleep(min(0.05 * 2**n, 1.0))  # another writer pushed: let it finish, then catch up
                continue
            commit = str(written.commit)
            doc = Accepted(
                id=written.allocation_id,
                tenant=tenant,
                state=state,
                commit=commit,
                pushed_to="/".join(self.push) if self.push else None,
                location=f"/api/v1/allocations/{written.allocation_id}",
            ).model_dump(mode="json")
            return Answer(202, doc), commit
        return _error(
            503,
            GIT_FAILED,
            f"the commit could not be pushed after {PUSH_ATTEMPTS} tries: {last.message if last else 'unknown'}",
        ), None

    def _catch_up(self) -> None:
        """Bring the checkout to the remote branch (fast-forward only: the intake never leaves local commits)."""
        if self.push is None:
            return
        remote, branch = self.push
        try:
            with git.Repo(self.repo) as repo:
                repo.git.fetch("--quiet", "--", remote, branch)  # values after "--": never options
                repo.git.merge("--ff-only", "--quiet", "FETCH_HEAD")
        except git.GitCommandError as e:
            log.warning(
                "intake: cannot catch up with %s/%s: %s",
                remote,
                branch,
                e,
                extra={"event": "serve.intake.catch_up_failed"},
            )

    # ------------------------------------------------------ serialization, db

    def _serialized(
        self,
        who: tenants.Principal,
        action: str,
        *,
        allocation_id: str | None,
        key: str | None,
        fingerprint_doc: dict[str, Any],
        work: Any,
    ) -> Answer:
        fingerprint = hashlib.sha256(json.dumps(fingerprint_doc, sort_keys=True).encode()).hexdigest()
        with self._lock:
            answer = self._locked(who, action, allocation_id=allocation_id, key=key, fingerprint=fingerprint, work=work)
            self.counts[answer.status] = self.counts.get(answer.status, 0) + 1
            return answer

    def _locked(
        self,
        who: tenants.Principal,
        action: str,
        *,
        allocation_id: str | None,
        key: str | None,
        fingerprint: str,
        work: Any,
    ) -> Answer:
        try:
            conn = self._connection()
        except psycopg.Error as e:
            return _error(503, DB_FAILED, f"the intake's database connection failed: {e}; nothing was written")
        try:
            with _advisory(conn):
                if key is not None:
                    row = conn.execute(
                        "SELECT fingerprint, status, response FROM portal_idempotency"
                        " WHERE principal = %s AND key = %s",
                        (who.name, key),
                    ).fetchone()
                    if row is not None:
                        if row[0] != fingerprint:
                            return _error(
                                422, KEY_REUSED, f"Idempotency-Key {key!r} was used with another request; use a new key"
                            )
                        return Answer(int(row[1]), row[2], replayed=True)
                answer: Answer
                answer, commit = work()
                try:
                    self._record(
                        conn,
                        who,
                        action,
                        allocation_id=allocation_id or answer.doc.get("id"),
                        key=key,
                        fingerprint=fingerprint,
                        answer=answer,
                        commit=commit,
                    )
                except psycopg.Error as e:
                    # The commit is pushed: that is the truth the client must hear. Only the audit line and
                    # the idempotency record are lost (a retry with this key would not be recognised).
                    log.error(
                        "intake %s %s: committed %s but not recorded: %s",
                        action,
                        answer.doc.get("id"),
                        commit,
                        e,
                        extra={"event": "serve.intake.unrecorded", "commit": commit},
                    )
                    self._drop()
                done: Answer = answer
                return done
        except psycopg.Error as e:
            self._drop()
            return _error(503, DB_FAILED, f"the intake's database failed: {e}")

    def _record(
        self,
        conn: psycopg.Connection[Any],
        who: tenants.Principal,
        action: str,
        *,
        allocation_id: Any,
        key: str | None,
        fingerprint: str,
        answer: Answer,
        commit: str | None,
    ) -> None:
        code = answer.doc.get("error", {}).get("code") if answer.status >= 400 else None
        with conn.transaction():
            conn.execute(
                "INSERT INTO portal_audit (principal, action, allocation_id, idempotency_key, status, code,"
                " commit_sha) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (who.name, action, allocation_id, key, answer.status, code, commit),
            )
            if key is not None and answer.status < 500:  # a temporary failure is retried, not remembered
                conn.execute(
                    "INSERT INTO portal_idempotency (principal, key, fingerprint, status, response)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    (who.name, key, fingerprint, answer.status, Jsonb(answer.doc)),
                )
        log.info(
            "intake %s %s by %s: %d %s",
            action,
            allocation_id,
            who.name,
            answer.status,
            commit or code or "",
            extra={
                "event": "serve.intake",
                "principal": who.name,
                "action": action,
                "allocation_id": allocation_id,
                "status": answer.status,
                "commit": commit,
            },
        )

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            kwargs = session_kwargs(
                self.db_url,
                read_only=False,
                statement_timeout_ms=30_000,
                connect_timeout=5,
                application_name="gpuaas-serve-intake",
            )
            self._conn = psycopg.connect(self.db_url, **kwargs)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@contextmanager
def _advisory(conn: psycopg.Connection[Any]) -> Iterator[None]:
    conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
    try:
        yield
    finally:
        if not (conn.closed or conn.broken):  # a lost session released its lock with it
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))


def _allocations(root: Path) -> dict[str, tuple[str, str]]:
    """Allocation id -> (tenant, desired state), as the repo has them now."""
    result = loading.parse_files(safefiles.iter_directory(root))
    return {a.id: (a.tenant, a.state.value) for a in result.state.allocations.values()}


def _short(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'body'}: {err['msg']}" for err in e.errors()[:5])
    return str(e)[:200]
