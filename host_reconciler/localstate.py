"""The host reconciler's own files under its state directory.

    <state_dir>/host.lock                 one reconciler per host (flock)
    <state_dir>/leases/slot-<N>.json      the slot lease: which allocation holds slot N
    <state_dir>/journal/<alloc>.json      provision phases proven done, with timings
    <state_dir>/journal/<alloc>.release.json   release phases done, hard_stopped
    <state_dir>/wipes/slot-<N>.json       the latest wipe/verify evidence of slot N
    <state_dir>/seeds/gpuaas-<alloc>/     cloud-init NoCloud seed (files + seed.iso)

Every file is written whole or not at all (temporary file, fsync, rename),
and a lease is created with link(2), which fails if the slot is taken, so a
reconciler killed at any instant leaves either the old or the new state and
never half a file. Leftover temporaries of a killed run are swept at start.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler.observations import Failure, PhaseRecord, Progress, WipeRecord
from schemas.errors import PermanentError, TemporaryError

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,120}$")


class StateError(PermanentError):
    code = host_codes.STATE_INVALID


def _safe(name: str) -> str:
    if not _SAFE.match(name) or name.endswith((".tmp", ".json")):
        raise StateError(f"unusable name for a state file: {name!r}")
    return name


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # unreadable: treated as absent, the phase runs again
    return doc if isinstance(doc, dict) else None


class LocalState:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.leases = root / "leases"
        self.journal = root / "journal"
        self.wipes = root / "wipes"
        self.seeds = root / "seeds"
        for d in (self.leases, self.journal, self.wipes, self.seeds):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock_fd: int | None = None

    # -- image pins the last plan carried (read by `gpuaas host image evict`) -----------------
    def write_image_pins(self, digests: tuple[str, ...]) -> None:
        path = self.root / "image-pins.json"
        data = json.dumps(sorted(digests)).encode()
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                return
        write_atomic(path, data)

    def read_image_pins(self) -> set[str]:
        try:
            doc = json.loads((self.root / "image-pins.json").read_text())
        except (OSError, ValueError):
            return set()
        return {str(d) for d in doc} if isinstance(doc, list) else set()

    # -- single instance ---------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        fd = os.open(self.root / "host.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                raise TemporaryError(
                    f"another host reconciler holds {self.root}/host.lock",
                    code=host_codes.STATE_LOCKED,
                    delay=5.0,
                ) from e
            self.sweep()
            yield
        finally:
            os.close(fd)

    def sweep(self) -> list[str]:
        """Remove temporaries of a killed run (call with the lock held)."""
        removed: list[str] = []
        for d in (self.leases, self.journal, self.wipes):
            for p in d.glob(".*.tmp"):
                p.unlink(missing_ok=True)
                removed.append(str(p))
        for p in self.seeds.glob(".*"):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(str(p))
        return removed

    # -- leases ------------------------------------------------------------------------------
    def _lease_path(self, slot: int) -> Path:
        return self.leases / f"slot-{int(slot)}.json"

    def read_leases(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for p in self.leases.glob("slot-*.json"):
            doc = _load(p)
            m = re.match(r"^slot-(\d+)\.json$", p.name)
            if doc and m and isinstance(doc.get("allocation_id"), str):
                out[int(m.group(1))] = doc["allocation_id"]
        return out

    def acquire_lease(self, slot: int, allocation_id: str) -> bool:
        """Take the slot's lease; True if allocation_id holds it now, False if another does."""
        path = self._lease_path(slot)
        tmp = self.leases / f".slot-{int(slot)}.{os.getpid()}.tmp"
        doc = {"allocation_id": _safe(allocation_id), "slot_index": slot, "since": now()}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps(doc).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.leases)
        holder = (_load(path) or {}).get("allocation_id")
        return holder == allocation_id

    def release_lease(self, slot: int, allocation_id: str | None = None) -> None:
        path = self._lease_path(slot)
        doc = _load(path)
        if doc is None:
            path.unlink(missing_ok=True)
            return
        if allocation_id is not None and doc.get("allocation_id") != allocation_id:
            return  # not ours to drop
        path.unlink(missing_ok=True)
        fsync_dir(self.leases)

    # -- journal -----------------------------------------------------------------------------
    def _journal_path(self, allocation_id: str, flow: str) -> Path:
        suffix = "" if flow == "provision" else f".{flow}"
        return self.journal / f"{_safe(allocation_id)}{suffix}.json"

    def read_journal(self, allocation_id: str, flow: str = "provision") -> dict[str, Any]:
        return _load(self._journal_path(allocation_id, flow)) or {}

    def update_journal(self, allocation_id: str, flow: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        doc = self.read_journal(allocation_id, flow)
        doc.setdefault("allocation_id", allocation_id)
        doc.setdefault("done", {})
        doc.update(changes)
        write_atomic(self._journal_path(allocation_id, flow), json.dumps(doc, sort_keys=True).encode())
        return doc

    def record_phase(
        self,
        allocation_id: str,
        flow: str,
        phase: str,
        ms: float,
        *,
        spec_digest: str | None = None,
        **extra: Any,
    ) -> None:
        doc = self.read_journal(allocation_id, flow)
        if spec_digest is not None and doc.get("spec_digest") != spec_digest:
            doc = {"spec_digest": spec_digest, "done": {}}  # a new spec starts a new journal
        done = dict(doc.get("done") or {})
        done[phase] = {"ms": round(ms, 3), "finished_at": now()}
        doc.update(extra)
        self.update_journal(allocation_id, flow, {**doc, "done": done})

    def record_failure(self, allocation_id: str, flow: str, failure: Failure, *, spec_digest: str | None) -> None:
        doc = self.read_journal(allocation_id, flow)
        if spec_digest is not None and doc.get("spec_digest") != spec_digest:
            doc = {"spec_digest": spec_digest, "done": {}}
        doc["failed"] = {
            "phase": failure.phase,
            "code": failure.code,
            "message": failure.message,
            "generation": failure.generation,
            "at": now(),
        }
        self.update_journal(allocation_id, flow, doc)

    def progress(self, flow: str = "provision") -> dict[str, Progress]:
        out: dict[str, Progress] = {}
        for p in self.journal.glob("*.json"):
            if p.name.startswith(".") or p.name.endswith(".release.json") != (flow == "release"):
                continue
            doc = _load(p)
            if not doc or not isinstance(doc.get("allocation_id"), str):
                continue
            done = {
                k: PhaseRecord(float(v.get("ms", 0)), str(v.get("finished_at", "")))
                for k, v in (doc.get("done") or {}).items()
                if isinstance(v, dict)
            }
            f = doc.get("failed")
            failure = (
                Failure(f["phase"], f["code"], f["message"], int(f["generation"])) if isinstance(f, dict) else None
            )
            out[doc["allocation_id"]] = Progress(
                doc["allocation_id"],
                str(doc.get("spec_digest", "")),
                done,
                failure,
                bool(doc.get("hard_stopped", False)),
            )
        return out

    def journal_allocations(self) -> set[str]:
        names = set()
        for p in self.journal.glob("*.json"):
            if not p.name.startswith("."):
                names.add(p.name.removesuffix(".json").removesuffix(".release"))
        return names

    def forget(self, allocation_id: str) -> None:
        for flow in ("provision", "release"):
            self._journal_path(allocation_id, flow).unlink(missing_ok=True)

    # -- wipe evidence -----------------------------------------------------------------------
    def _wipe_path(self, slot: int) -> Path:
        return self.wipes / f"slot-{int(slot)}.json"

    def read_wipes(self) -> dict[int, WipeRecord]:
        out: dict[int, WipeRecord] = {}
        for p in self.wipes.glob("slot-*.json"):
            doc = _load(p)
            if not doc:
                continue
            out[int(doc["slot_index"])] = WipeRecord(
                int(doc["slot_index"]),
                str(doc["allocation_id"]),
                bool(doc.get("wiped")),
                bool(doc.get("verified")),
                doc.get("blocked"),
                doc.get("evidence") or {},
            )
        return out

    def write_wipe(
        self,
        slot: int,
        allocation_id: str,
        *,
        wiped: bool,
        verified: bool,
        blocked: str | None,
        evidence: Mapping[str, Any],
    ) -> None:
        current = _load(self._wipe_path(slot)) or {}
        merged: dict[str, Any] = {}
        if current.get("allocation_id") == allocation_id:
            merged = dict(current.get("evidence") or {})
        merged.update(evidence)
        doc = {
            "slot_index": slot,
            "allocation_id": allocation_id,
            "wiped": wiped,
            "verified": verified,
            "blocked": blocked,
            "evidence": merged,
            "updated_at": now(),
        }
        write_atomic(self._wipe_path(slot), json.dumps(doc, sort_keys=True, default=str).encode())

    def rewipe(self, slot: int) -> dict[str, Any] | None:
        """An operator's rewipe: the slot's block is lifted and its cleanup starts over (wipe, verify, health).

        The evidence of the blocked attempt is kept under `previous`; returns the record as it was (None: none).
        """
        doc = _load(self._wipe_path(slot))
        if not doc:
            return None
        before = dict(doc)
        evidence = dict(doc.get("evidence") or {})
        previous = {k: evidence.pop(k) for k in ("wipe", "verify", "slot_health") if k in evidence}
        evidence["previous"] = {**previous, "blocked": doc.get("blocked")}
        doc.update(blocked=None, wiped=False, verified=False, evidence=evidence, updated_at=now())
        write_atomic(self._wipe_path(slot), json.dumps(doc, sort_keys=True, default=str).encode())
        return before

    def clear_blocked(self, slot: int) -> bool:
        doc = _load(self._wipe_path(slot))
        if not doc or not doc.get("blocked"):
            return False
        doc.update(blocked=None, wiped=False, verified=False)
        write_atomic(self._wipe_path(slot), json.dumps(doc, sort_keys=True, default=str).encode())
        return True

    # -- cloud-init seeds --------------------------------------------------------------------
    def seed_dir(self, vm_name: str) -> Path:
        return self.seeds / _safe(vm_name)

    def read_seeds(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for d in self.seeds.iterdir():
            if d.name.startswith(".") or not d.is_dir():
                continue
            try:
                out[d.name] = (d / "spec-digest").read_text().strip()
            except OSError:
                out[d.name] = ""
        return out

    def install_seed(self, vm_name: str, files: Mapping[str, bytes], build: Any = None) -> Path:
        """Write a seed directory whole: temporary dir, optional `build(dir)`, rename into place."""
        final = self.seed_dir(vm_name)
        tmp = self.seeds / f".tmp-{vm_name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700)
        for name, data in files.items():
            write_atomic(tmp / _safe(name), data)
        if build is not None:
            build(tmp)
        fsync_dir(tmp)
        if final.exists():
            old = self.seeds / f".old-{vm_name}-{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
        fsync_dir(self.seeds)
        return final

    def remove_seed(self, vm_name: str) -> bool:
        d = self.seed_dir(vm_name)
        if not d.exists():
            return False
        old = self.seeds / f".old-{vm_name}-{os.getpid()}"
        os.replace(d, old)
        fsync_dir(self.seeds)
        shutil.rmtree(old, ignore_errors=True)
        return True
