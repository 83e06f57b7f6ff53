"""The release steps: stop the domain (gracefully, then hard), undefine it, drop its
DHCP reservation and seed, then per slot wipe, verify and free the disk.

A slot is freed only on a verified wipe of the allocation that held it. A
defined domain that still names the disk postpones the wipe; a permanent wipe
or verify refusal makes the slot cleanup-blocked (`converging`).
"""

from __future__ import annotations

from host_reconciler.actions import Action
from host_reconciler.context import Context, Result, one_slot, require_vm
from host_reconciler.observations import DomainState
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import VmSpec


def _running(state: DomainState | None) -> bool:
    return state in (DomainState.RUNNING, DomainState.PAUSED)


def graceful_stop(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    dd = ctx.drivers.domains
    if not _running(dd.state(v.name)):
        return {"graceful": True, "waited_s": 0.0}
    dd.shutdown(v.name)
    t0 = ctx.clock()
    deadline = t0 + ctx.plan.graceful_timeout_s
    while _running(dd.state(v.name)):
        if ctx.clock() >= deadline:
            return {"graceful": False, "waited_s": round(ctx.clock() - t0, 3)}
        ctx.sleep(min(ctx.settings.graceful_poll_s, max(0.0, deadline - ctx.clock())))
    return {"graceful": True, "waited_s": round(ctx.clock() - t0, 3)}


def hard_stop(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    if not _running(ctx.drivers.domains.state(v.name)):
        return {}
    ctx.drivers.domains.destroy(v.name)
    return {"hard_stopped": True}


def undefine(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    if _running(ctx.drivers.domains.state(v.name)):
        raise TemporaryError(f"{v.name} is still running; not undefining it", code="host.domain.still_running")
    ctx.drivers.domains.undefine(v.name)
    return {}


def remove_reservation(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    removed = ctx.drivers.dhcp.remove_reservation(v.name)
    seed = ctx.state.remove_seed(v.name)
    return {"reservation_removed": removed, "seed_removed": seed}


def wipe(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    slot = one_slot(action)
    sd = ctx.slot_disk(v, slot)
    users = sorted(n for n, d in ctx.drivers.domains.domains().items() if sd.device in d.facts.disks)
    if users:  # a defined domain (running or not) still names this disk: never wipe under it
        raise TemporaryError(
            f"slot {slot}: {sd.device} belongs to domain(s) {', '.join(users)}",
            code="host.disk.in_use_by_domain",
            delay=5.0,
        )
    evidence = ctx.drivers.disks.wipe(sd)
    ctx.state.write_wipe(slot, v.allocation_id, wiped=True, verified=False, blocked=None, evidence={"wipe": evidence})
    return {"method": evidence.get("method")}


def verify(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    slot = one_slot(action)
    evidence = ctx.drivers.disks.verify(ctx.slot_disk(v, slot))
    ctx.state.write_wipe(
        slot,
        v.allocation_id,
        wiped=True,
        verified=True,
        blocked=None,
        evidence={"verify": evidence},
    )
    return {}


def report_free(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    slot = one_slot(action)
    rec = ctx.state.read_wipes().get(slot)
    if rec is None or rec.allocation_id != v.allocation_id or not rec.verified:
        raise PermanentError(f"slot {slot} has no verified wipe for {v.allocation_id}", code="host.wipe.unproven")
    ctx.state.release_lease(slot, v.allocation_id)
    return {}
