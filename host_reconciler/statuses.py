"""Host status: what the node reports after a pass, per slot and per VM.

Pure: built from the plan, what was observed after acting, the actions
still pending and the errors of the pass. The store writes it into
`host_status` (node) and `host_slot_status` (one row per slot); the central
reconciler frees a released slot only on `wipe_state = verified` with
evidence naming the slot's by-id disk, `signature_clear` and `sampled_zero`.

Slot states use the project's `SlotStatus` vocabulary:

    provisioning -> active                      a VM of the plan
    releasing -> cleanup -> available (+proof)  a release of the plan
                         -> cleanup_blocked     wipe, verify or slot health failed (this slot only)
    available                                   free (schedulable unless blocking drift)
    failed                                      provisioning failed at this generation
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from host_reconciler import diff, domains
from host_reconciler.actions import BLOCKING_DRIFT, Action, Drift, DriftMode, Step
from host_reconciler.imagecache import CacheEntry, PartialFetch
from host_reconciler.observations import HostObservation, WipeRecord
from schemas.hostplans import HostPlan, VmSpec
from schemas.hostreports import HostReport
from schemas.states import SlotStatus


@dataclass(frozen=True, slots=True)
class StepError:
    allocation_id: str
    step: str
    code: str
    message: str
    retry: bool
    slot_indexes: tuple[int, ...] = ()
    delay: float = 0.0  # seconds before a retry is worth it

    def as_dict(self) -> dict[str, Any]:
        return {
            "allocation_id": self.allocation_id,
            "step": self.step,
            "code": self.code,
            "message": self.message,
            "retry": self.retry,
            "slot_indexes": list(self.slot_indexes),
        }


@dataclass(frozen=True, slots=True)
class SlotReport:
    slot_index: int
    state: SlotStatus
    allocation_id: str | None
    vm_state: str  # host_slot_status.vm_state vocabulary
    vm_ready_at: str | None
    phase: str | None
    wipe_allocation_id: str | None
    wipe_state: str | None  # running | verified | failed
    wipe_evidence: Mapping[str, Any]
    wipe_error: str | None
    phase_timings: Mapping[str, float]
    drift: tuple[Drift, ...]
    schedulable: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot_index": self.slot_index,
            "state": str(self.state),
            "allocation_id": self.allocation_id,
            "vm_state": self.vm_state,
            "vm_ready_at": self.vm_ready_at,
            "phase": self.phase,
            "wipe_allocation_id": self.wipe_allocation_id,
            "wipe_state": self.wipe_state,
            "wipe_evidence": dict(self.wipe_evidence),
            "wipe_error": self.wipe_error,
            "phase_timings": dict(self.phase_timings),
            "drift": [d.as_dict() for d in self.drift],
            "schedulable": self.schedulable,
        }


@dataclass(frozen=True, slots=True)
class VmReport:
    allocation_id: str
    name: str
    state: str  # provisioning | active | stopped | failed | releasing | released
    phase: str | None
    phase_timings: Mapping[str, float]
    error: StepError | None = None
    hard_stopped: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "allocation_id": self.allocation_id,
            "name": self.name,
            "state": self.state,
            "phase": self.phase,
            "phase_timings": dict(self.phase_timings),
            "error": self.error.as_dict() if self.error else None,
            "hard_stopped": self.hard_stopped,
        }


@dataclass(frozen=True, slots=True)
class ImageCacheReport:
    """The node's image cache after the pass: `node_image_cache` rows and fetch progress."""

    entries: tuple[CacheEntry, ...] = ()
    fetching: tuple[PartialFetch, ...] = ()  # downloads not finished (bytes so far / total)
    budget_bytes: int | None = None
    in_use: tuple[str, ...] = ()  # digests the plan's VMs name (never evicted)
    pinned: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        keep = set(self.in_use) | set(self.pinned)
        return {
            "budget_bytes": self.budget_bytes,
            "used_bytes": sum(e.size for e in self.entries),
            "cached": [
                {
                    **e.as_dict(),
                    "in_use": e.digest in self.in_use,
                    "pinned": e.digest in self.pinned,
                    "evictable": e.digest not in keep,
                }
                for e in self.entries
            ],
            "fetching": [f.as_dict() for f in self.fetching],
        }


@dataclass(frozen=True, slots=True)
class HostStatus:
    node: str
    generation: int
    observed_generation: int
    mode: DriftMode
    converged: bool
    healthy: bool
    slots: tuple[SlotReport, ...]
    vms: tuple[VmReport, ...]
    drift: tuple[Drift, ...]
    errors: tuple[StepError, ...]
    pending: tuple[str, ...]
    reported_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
    pass_ms: float = 0.0
    images: ImageCacheReport = field(default_factory=ImageCacheReport)
    host: HostReport | None = None  # firmware evidence, bootstrap state, reboot need, agent version
    # allocation -> the guest's newest GPU telemetry sample (telemetry.Sample.as_dict + received_at, unix s)
    telemetry: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    guest_refused: Mapping[str, int] = field(default_factory=dict)  # guest posts refused since start, by reason

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "generation": self.generation,
            "observed_generation": self.observed_generation,
            "mode": str(self.mode),
            "converged": self.converged,
            "healthy": self.healthy,
            "reported_at": self.reported_at,
            "pass_ms": self.pass_ms,
            "slots": [s.as_dict() for s in self.slots],
            "vms": [v.as_dict() for v in self.vms],
            "drift": [d.as_dict() for d in self.drift],
            "errors": [e.as_dict() for e in self.errors],
            "pending": list(self.pending),
            "images": self.images.as_dict(),
            "host": self.host.as_dict() if self.host is not None else None,
            "telemetry": {a: dict(t) for a, t in self.telemetry.items()},
            "guest_reports_refused": dict(self.guest_refused),
        }


def wipe_evidence(rec: WipeRecord | None) -> dict[str, Any]:
    """The evidence document the central reconciler checks (see host_slot_status in 0002)."""
    if rec is None:
        return {}
    ev = dict(rec.evidence)
    verify = ev.get("verify") or {}
    wipe = ev.get("wipe") or {}
    doc: dict[str, Any] = {
        "device": verify.get("device") or wipe.get("device"),
        "resolved": verify.get("resolved") or wipe.get("resolved"),
        "method": wipe.get("method"),
        "signature_clear": bool(verify.get("signature_clear", False)),
        "sampled_zero": bool(verify.get("sampled_zero", False)),
        "verified": rec.verified,
        "wiped_at": wipe.get("wiped_at"),
        "verified_at": verify.get("verified_at"),
        "signatures_before": wipe.get("signatures_before", []),
        "health": dict(ev.get("slot_health") or {}),  # the slot's GPU/VF reset and identity proof
        "wipe": wipe,
        "verify": verify,
    }
    refused = diff.identity_refusal(rec)
    if refused is not None:  # why the slot is blocked: its disk is not the approved one
        doc["identity"] = dict(refused)
    return doc


@dataclass
class _Builder:
    plan: HostPlan
    observed: HostObservation
    errors: Sequence[StepError]
    pending: dict[str, str]  # allocation -> next pending step
    slot_drift: dict[int | None, list[Drift]]
    slots: dict[int, SlotReport] = field(default_factory=dict)
    vms: list[VmReport] = field(default_factory=list)

    def error(self, alloc: str, slot: int | None = None) -> StepError | None:
        return next(
            (
                e
                for e in self.errors
                if e.allocation_id == alloc and (slot is None or not e.slot_indexes or slot in e.slot_indexes)
            ),
            None,
        )

    def drift(self, slot: int) -> tuple[Drift, ...]:
        return tuple(self.slot_drift.get(slot, ()))

    def provision(self, vm: VmSpec, digest: str) -> None:
        prog = self.observed.progress.get(vm.allocation_id)
        active_once = prog is not None and Step.READINESS in prog.done  # whatever spec it had then
        prog = prog if prog is not None and (active_once or prog.spec_digest == digest) else None
        done = dict(prog.done) if prog else {}
        dom = self.observed.domains.get(vm.name)
        running = dom is not None and dom.running
        err = self.error(vm.allocation_id)
        failure = prog.failed if prog is not None else None
        if failure is not None and failure.generation == self.plan.generation:
            state, vm_state, phase = "failed", "failed", failure.phase
            err = err or StepError(vm.allocation_id, failure.phase, failure.code, failure.message, retry=False)
        elif Step.READINESS in done:
            state = "active" if running else "stopped"
            vm_state, phase = ("ready" if running else "stopped"), None
        else:
            state, vm_state = "provisioning", "provisioning"
            phase = self.pending.get(vm.allocation_id)
        timings = {k: r.ms for k, r in done.items()}
        self.vms.append(VmReport(vm.allocation_id, vm.name, state, phase, timings, err))
        ready_at = done[Step.READINESS].finished_at if Step.READINESS in done else None
        slot_state = {
            "active": SlotStatus.ACTIVE,
            "stopped": SlotStatus.ACTIVE,
            "failed": SlotStatus.FAILED,
            "provisioning": SlotStatus.PROVISIONING,
        }[state]
        for b in vm.bundles:
            self.slots[b.slot_index] = SlotReport(
                b.slot_index,
                slot_state,
                vm.allocation_id,
                vm_state,
                ready_at,
                phase,
                None,
                None,
                {},
                None,
                timings,
                self.drift(b.slot_index),
                schedulable=False,
            )

    def release(self, vm: VmSpec) -> None:
        dom = self.observed.domains.get(vm.name)
        vm_state = ("stopping" if dom.running else "stopped") if dom is not None else "absent"
        freed = 0
        for b in vm.bundles:
            rec = self.observed.wipes.get(b.slot_index)
            rec = rec if rec is not None and rec.allocation_id == vm.allocation_id else None
            leased = self.observed.leases.get(b.slot_index) == vm.allocation_id
            if rec is not None and rec.blocked:
                st, wstate = SlotStatus.CLEANUP_BLOCKED, "failed"
            elif rec is not None and rec.verified and not leased:
                st, wstate = SlotStatus.AVAILABLE, "verified"
                freed += 1
            elif rec is not None and (rec.verified or rec.wiped):
                # "verified" (what frees the slot centrally) only once its devices passed the health step too
                st, wstate = SlotStatus.CLEANUP, "verified" if rec.verified and rec.healthy else "running"
            elif dom is not None:
                st, wstate = SlotStatus.RELEASING, None
            else:
                st, wstate = SlotStatus.CLEANUP, "running" if leased else None
            err = self.error(vm.allocation_id, b.slot_index)
            why = rec.blocked if rec and rec.blocked else (f"{err.code}: {err.message}" if err else None)
            found = self.drift(b.slot_index)
            self.slots[b.slot_index] = SlotReport(
                b.slot_index,
                st,
                vm.allocation_id,
                vm_state,
                None,
                self.pending.get(vm.allocation_id),
                vm.allocation_id,
                wstate,
                wipe_evidence(rec),
                why,
                {},
                found,
                schedulable=st is SlotStatus.AVAILABLE and not _blocking(found),
            )
        released = freed == len(vm.bundles)
        prog = self.observed.release_progress.get(vm.allocation_id)
        self.vms.append(
            VmReport(
                vm.allocation_id,
                vm.name,
                "released" if released else "releasing",
                None if released else self.pending.get(vm.allocation_id),
                {k: r.ms for k, r in prog.done.items()} if prog else {},
                self.error(vm.allocation_id),
                hard_stopped=bool(prog and prog.hard_stopped),
            )
        )

    def free(self, slot: int) -> None:
        rec = self.observed.wipes.get(slot)
        blocked = rec is not None and bool(rec.blocked)
        found = self.drift(slot)
        wstate = None
        if rec is not None:
            wstate = "failed" if blocked else "verified" if rec.verified else "running"
        self.slots[slot] = SlotReport(
            slot,
            SlotStatus.CLEANUP_BLOCKED if blocked else SlotStatus.AVAILABLE,
            None,
            "absent",
            None,
            None,
            rec.allocation_id if rec else None,
            wstate,
            wipe_evidence(rec),
            rec.blocked if rec else None,
            {},
            found,
            schedulable=not blocked and not _blocking(found),
        )


def build(
    plan: HostPlan,
    observed: HostObservation,
    *,
    pending: Sequence[Action],
    errors: Sequence[StepError],
    drift: Sequence[Drift],
    mode: DriftMode,
    options: domains.DomainOptions,
    pass_ms: float = 0.0,
    images: ImageCacheReport | None = None,
    host: HostReport | None = None,
    telemetry: Mapping[str, Mapping[str, Any]] | None = None,
    guest_refused: Mapping[str, int] | None = None,
) -> HostStatus:
    slot_drift: dict[int | None, list[Drift]] = {}
    for d in drift:
        slot_drift.setdefault(d.slot_index, []).append(d)
    b = _Builder(plan, observed, errors, _first_pending(pending), slot_drift)
    for vm in plan.vms:
        b.provision(vm, domains.spec_digest(vm, plan.network, options))
    for vm in plan.releases:
        b.release(vm)
    for s in plan.slots:
        if s.slot_index not in b.slots:
            b.free(s.slot_index)
    return HostStatus(
        node=plan.node,
        generation=plan.generation,
        observed_generation=plan.generation,
        mode=mode,
        converged=not pending and not any(v.state == "failed" for v in b.vms),
        healthy=not observed.network,
        slots=tuple(b.slots[i] for i in sorted(b.slots)),
        vms=tuple(b.vms),
        drift=tuple(drift),
        errors=tuple(errors),
        pending=tuple(a.describe() for a in pending),
        pass_ms=pass_ms,
        images=images or ImageCacheReport(),
        host=host,
        telemetry=dict(telemetry or {}),
        guest_refused=dict(guest_refused or {}),
    )


def _first_pending(pending: Iterable[Action]) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in pending:
        out.setdefault(a.allocation_id, str(a.step))
    return out


def _blocking(found: Iterable[Drift]) -> bool:
    return any(d.code in BLOCKING_DRIFT for d in found)
