"""One host-reconciler pass: observe, diff, act, report.

`Converger.converge(plan)` takes the host lock, observes the node, asks the
pure `diff` for the actions, runs them in order through `phases.STEPS`,
journals each finished phase with its timing, observes again and builds the
host status (per-slot state, wipe evidence, drift, phase timings, what is
still pending). `dry_run=True` stops after the diff: nothing is changed.

What a failure means is decided here, in `_failed`, and nowhere else:

- TemporaryError (and anything unexpected): the pass skips the rest of that
  allocation's actions; the next pass retries after `delay`;
- PermanentError while provisioning: the VM is failed at this plan
  generation (journaled); a new generation retries it;
- PermanentError in wipe, verify or slot_health: that one slot becomes
  cleanup_blocked, with the evidence gathered so far; the other slots go on;
- PermanentError in another release step or a heal: reported, retried on the
  next pass (a release must eventually finish).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler import diff, observing, onboarding, phases, statuses
from host_reconciler.actions import PER_SLOT_STEPS, SLOT_BLOCKING_STEPS, Action, DriftMode, Flow, Step
from host_reconciler.context import Context, Drivers
from host_reconciler.drivers.protocols import reservation_for
from host_reconciler.localstate import LocalState
from host_reconciler.observations import Failure, HostObservation
from host_reconciler.settings import HostSettings
from schemas.errors import GpuaasError, PermanentError, TemporaryError
from schemas.hostplans import HostPlan, VmSpec
from schemas.hostreports import HostReport

log = logging.getLogger("gpuaas.host")

# Called before each step ("start") and after its effect, before it is journaled ("done").
StepHook = Callable[[Action, str], None]


@dataclass(frozen=True, slots=True)
class PassResult:
    planned: tuple[Action, ...]
    executed: tuple[tuple[Action, float], ...]  # (action, ms)
    errors: tuple[statuses.StepError, ...]
    status: statuses.HostStatus
    observed: HostObservation
    dry_run: bool
    retry_after: float | None
    ms: float


class Converger:
    def __init__(
        self,
        settings: HostSettings,
        drivers: Drivers,
        *,
        state: LocalState | None = None,
        on_step: StepHook | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.drivers = drivers
        self.state = state or LocalState(settings.state_dir)
        self.on_step = on_step
        self.clock = clock
        self.sleep = sleep

    def context(self, plan: HostPlan) -> Context:
        if plan.node != self.settings.node:
            raise PermanentError(
                f"plan for {plan.node} handed to the reconciler of {self.settings.node}",
                code=host_codes.PLAN_WRONG_NODE,
            )
        return Context(plan, self.settings, self.drivers, self.state, clock=self.clock, sleep=self.sleep)

    def converge(self, plan: HostPlan, *, dry_run: bool = False, mode: DriftMode | None = None) -> PassResult:
        t0 = self.clock()
        mode = mode or self.settings.drift_mode
        ctx = self.context(plan)
        opts = ctx.options()
        if dry_run:
            observed = observing.observe(ctx)
            actions = diff.diff(plan, observed, options=opts, mode=mode)
            found = diff.drift(plan, observed, options=opts)
            ms = (self.clock() - t0) * 1000
            status = statuses.build(
                plan,
                observed,
                pending=actions,
                errors=(),
                drift=found,
                mode=mode,
                options=opts,
                pass_ms=ms,
                images=self._image_report(ctx, observed),
                host=self._host_report(),
            )
            return PassResult(tuple(actions), (), (), status, observed, True, None, ms)
        with self.state.locked():
            observed = observing.observe(ctx, full=mode is DriftMode.SELF_HEAL)
            actions = diff.diff(plan, observed, options=opts, mode=mode)
            executed, errors = self._apply(ctx, actions)
            self._enforce_image_budget(ctx)
            after = observing.observe(ctx)
            pending = diff.diff(plan, after, options=opts, mode=DriftMode.REPORT)
            found = diff.drift(plan, after, options=opts)
            self._collect_garbage(plan, after)
        ms = (self.clock() - t0) * 1000
        status = statuses.build(
            plan,
            after,
            pending=pending,
            errors=errors,
            drift=found,
            mode=mode,
            options=opts,
            pass_ms=ms,
            images=self._image_report(ctx, after),
            host=self._host_report(),
            telemetry=self._telemetry(plan),
            guest_refused=self.drivers.readiness.refused() if self.drivers.readiness is not None else {},
        )
        delays = [e.delay for e in errors if e.retry]
        return PassResult(
            tuple(actions),
            tuple(executed),
            tuple(errors),
            status,
            after,
            False,
            min(delays) if delays else None,
            ms,
        )

    # -- acting ----------------------------------------------------------------------------
    def _apply(
        self, ctx: Context, actions: list[Action]
    ) -> tuple[list[tuple[Action, float]], list[statuses.StepError]]:
        executed: list[tuple[Action, float]] = []
        errors: list[statuses.StepError] = []
        stopped: set[str] = set()
        stopped_slots: set[tuple[str, int]] = set()
        for action in actions:
            key = f"{action.flow}:{action.allocation_id}:{action.target}"
            if key in stopped:
                continue
            if action.step in PER_SLOT_STEPS and any((key, s) in stopped_slots for s in action.slot_indexes):
                continue
            vm = _vm_of(ctx.plan, action)
            if self.on_step:
                self.on_step(action, "start")
            t = self.clock()
            try:
                extra = phases.STEPS[action.step](ctx, action, vm)
            except Exception as e:
                err = self._failed(ctx, action, vm, e)
                errors.append(err)
                if action.step in PER_SLOT_STEPS:
                    stopped_slots |= {(key, s) for s in action.slot_indexes}
                else:
                    stopped.add(key)
                continue
            ms = (self.clock() - t) * 1000
            if self.on_step:
                self.on_step(action, "done")
            self._record(ctx, action, vm, ms, extra)
            executed.append((action, ms))
        return executed, errors

    def _record(
        self,
        ctx: Context,
        action: Action,
        vm: VmSpec | None,
        ms: float,
        extra: dict[str, Any],
    ) -> None:
        if vm is None or action.flow is Flow.HEAL:
            return
        alloc = action.allocation_id
        if action.flow is Flow.PROVISION:
            journal = self.state.read_journal(alloc)
            facts = dict(journal.get("facts") or {}) if journal.get("spec_digest") == ctx.digest(vm) else {}
            facts[str(action.step)] = {k: v for k, v in extra.items() if k != "image"}
            more: dict[str, Any] = {"facts": facts}
            if "image" in extra:
                more["image"] = extra["image"]
            self.state.record_phase(alloc, "provision", str(action.step), ms, spec_digest=ctx.digest(vm), **more)
            return
        name = str(action.step)
        if action.step in PER_SLOT_STEPS:
            name = f"{action.step}[{','.join(str(s) for s in action.slot_indexes)}]"
        more = {"hard_stopped": True} if extra.get("hard_stopped") else {}
        self.state.record_phase(alloc, "release", name, ms, **more)

    def _failed(self, ctx: Context, action: Action, vm: VmSpec | None, exc: Exception) -> statuses.StepError:
        """The one place that decides what a failed step means (module docstring)."""
        if isinstance(exc, TemporaryError):
            retry, code, delay = True, exc.code, exc.delay
        elif isinstance(exc, PermanentError):
            retry, code, delay = False, exc.code, 0.0
        elif isinstance(exc, GpuaasError):
            retry, code, delay = True, exc.code, 1.0
        else:
            log.exception("unexpected failure in %s", action.describe())
            retry, code, delay = True, "host.unexpected", 5.0
        message = exc.message if isinstance(exc, GpuaasError) else f"{type(exc).__name__}: {exc}"
        err = statuses.StepError(
            action.allocation_id, str(action.step), code, message, retry, action.slot_indexes, delay
        )
        if retry:
            log.warning("%s failed, will retry: %s: %s", action.describe(), code, message)
            return err
        log.error("%s failed: %s: %s", action.describe(), code, message)
        if action.flow is Flow.PROVISION and vm is not None:
            self.state.record_failure(
                action.allocation_id,
                "provision",
                Failure(str(action.step), code, message, ctx.plan.generation),
                spec_digest=ctx.digest(vm),
            )
        elif action.flow is Flow.RELEASE and action.step in SLOT_BLOCKING_STEPS:
            evidence = getattr(exc, "evidence", None) or {}
            for slot in action.slot_indexes:
                self.state.write_wipe(
                    slot,
                    action.allocation_id,
                    wiped=action.step is not Step.WIPE,
                    verified=action.step is Step.SLOT_HEALTH,  # the disk is proven; its devices are not
                    blocked=f"{code}: {message}",
                    evidence={str(action.step): evidence} if evidence else {},
                )
        return err

    def _enforce_image_budget(self, ctx: Context) -> None:
        """Keep the image cache within its budget after every pass (LRU; in-use and pinned images stay)."""
        try:
            self.state.write_image_pins(ctx.plan.pinned_images)  # `gpuaas host image evict` keeps them too
            ctx.enforce_image_budget()
        except (GpuaasError, OSError) as e:
            log.warning("image cache eviction failed: %s", e)

    def _image_report(self, ctx: Context, observed: HostObservation) -> statuses.ImageCacheReport:
        try:
            budget: int | None = self.settings.image_budget()
        except OSError:
            budget = None
        return statuses.ImageCacheReport(
            entries=tuple(observed.images[d] for d in sorted(observed.images)),
            fetching=observed.image_fetches,
            budget_bytes=budget,
            in_use=tuple(sorted(ctx.images_in_use())),
            pinned=tuple(sorted(ctx.images_pinned())),
        )

    def _host_report(self) -> HostReport:
        """Firmware evidence and bootstrap state, read each pass (a few small files)."""
        return onboarding.report(self.settings.firmware_dir, self.settings.bootstrap_dir)

    def _telemetry(self, plan: HostPlan) -> dict[str, dict[str, Any]]:
        """The guests' newest GPU samples, per allocation of the plan (one more report kind of the status)."""
        if self.drivers.readiness is None:
            return {}
        vms = {vm.name: vm for vm in plan.vms if vm.bundles}
        try:
            expected = {name: reservation_for(vm, plan.network).ip for name, vm in vms.items()}
            latest = self.drivers.readiness.guest_telemetry(expected)
        except GpuaasError as e:  # telemetry never fails a pass
            log.warning("guest telemetry unavailable: %s: %s", e.code, e.message)
            return {}
        return {vms[name].allocation_id: sample for name, sample in latest.items() if name in vms}

    def _collect_garbage(self, plan: HostPlan, observed: HostObservation) -> None:
        """Forget the journals of allocations that left the plan and left nothing behind."""
        planned = {vm.allocation_id for vm in (*plan.vms, *plan.releases)}
        in_use = set(observed.leases.values()) | {d.facts.allocation_id for d in observed.domains.values()}
        for alloc in self.state.journal_allocations() - planned - in_use:
            self.state.forget(alloc)


def _vm_of(plan: HostPlan, action: Action) -> VmSpec | None:
    pool = plan.releases if action.flow is Flow.RELEASE else plan.vms
    return next((vm for vm in pool if vm.allocation_id == action.allocation_id), None)
