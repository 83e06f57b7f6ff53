"""The drift heals of a self-heal pass: start or redefine a planned domain, and remove
what no plan entry names (a `gpuaas-*` domain, a DHCP reservation, a seed, a slot lease).

Each heal re-checks that its target is still an orphan before removing it.
"""

from __future__ import annotations

from host_reconciler import codes as host_codes
from host_reconciler import domains
from host_reconciler.actions import Action
from host_reconciler.context import Context, Result, one_slot, require_vm
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import VmSpec


def start_domain(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    ctx.drivers.domains.start(require_vm(vm, action).name)
    return {}


def redefine_domain(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    ctx.drivers.domains.define(ctx.xml(v))
    return {"note": "persistent definition replaced; a running VM picks it up at its next boot"}


def _planned_names(ctx: Context) -> set[str]:
    return {v.name for v in (*ctx.plan.vms, *ctx.plan.releases)}


def remove_orphan_domain(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    name = action.target
    if not name.startswith(domains.PREFIX) or name in _planned_names(ctx):
        raise PermanentError(f"{name!r} is not an orphan of this host", code=host_codes.HEAL_NOT_ORPHAN)
    ctx.drivers.domains.destroy(name)
    ctx.drivers.domains.undefine(name)
    return {}


def remove_stale_reservation(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    if action.target in {v.name for v in ctx.plan.vms}:
        raise PermanentError(f"{action.target} belongs to a planned VM", code=host_codes.HEAL_NOT_ORPHAN)
    return {"removed": ctx.drivers.dhcp.remove_reservation(action.target)}


def remove_orphan_seed(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    if action.target in _planned_names(ctx):
        raise PermanentError(f"{action.target} belongs to a plan entry", code=host_codes.HEAL_NOT_ORPHAN)
    return {"removed": ctx.state.remove_seed(action.target)}


def remove_orphan_lease(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    slot = one_slot(action)
    holder = ctx.state.read_leases().get(slot)
    planned = {v.allocation_id for v in (*ctx.plan.vms, *ctx.plan.releases)}
    if holder is None or holder in planned:
        return {}
    disk = next((s.nvme_device for s in ctx.plan.slots if s.slot_index == slot), None)
    if disk and any(disk in d.facts.disks for d in ctx.drivers.domains.domains().values()):
        raise TemporaryError(f"slot {slot} disk is still attached to a domain", code=host_codes.HEAL_LEASE_IN_USE)
    ctx.state.release_lease(slot, holder)
    return {"released": holder}
