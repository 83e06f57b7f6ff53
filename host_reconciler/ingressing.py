"""The ingress steps: install a VM's public endpoints, remove a released one's, remove strays.

Each step re-reads the rules it acts on (the driver's `add` and `delete` are
idempotent), so a pass that crashed halfway ends in the same rules when run
again. A VM's endpoints go in after its domain starts and before readiness
passes (`actions.PROVISION_STEPS`); a released VM's come out before its disks
are wiped (`actions.RELEASE_STEPS`): no public port ever leads to a disk
being wiped or to a VM that is gone.
"""

from __future__ import annotations

from host_reconciler import codes as host_codes
from host_reconciler import ingresses
from host_reconciler.actions import Action
from host_reconciler.context import Context, Result, require_vm
from host_reconciler.drivers.protocols import IngressDriver
from schemas.errors import PermanentError
from schemas.hostplans import VmSpec


def _driver(ctx: Context, action: Action) -> IngressDriver:
    if ctx.drivers.ingress is None:
        raise PermanentError(f"{action.step}: this host runs no ingress driver", code=host_codes.INGRESS_NO_DRIVER)
    return ctx.drivers.ingress


def install(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    """The VM's planned endpoints, both halves each (provision, and the heal of a missing one)."""
    v = require_vm(vm, action)
    want = ingresses.planned(ctx.plan, v.allocation_id)
    if not want:
        return {"endpoints": 0}
    driver = _driver(ctx, action)
    changed = sum(driver.add(ctx.plan.network.bridge, rule) for rule in want)
    return {
        "endpoints": len(want),
        "changed": changed,
        "ssh": next((ingresses.describe(r) for r in want if r.guest_port == 22), None),
    }


def remove(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    """Every rule of the released allocation, whatever port it names (read back from the host)."""
    v = require_vm(vm, action)
    if ctx.drivers.ingress is None:
        return {"removed": 0}
    driver = ctx.drivers.ingress
    mine = [r for r in driver.observe().written if r.allocation_id == v.allocation_id]
    return {"removed": sum(driver.delete(r) for r in mine)}


def remove_strays(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    """Rules of ours no planned endpoint names (outside a release) and foreign rules in our chains."""
    driver = _driver(ctx, action)
    seen = driver.observe()
    releasing = {v.allocation_id for v in ctx.plan.releases}
    stray = [r for r in seen.written - set(ctx.plan.ingress) if r.allocation_id not in releasing]
    removed = sum(driver.delete(r) for r in stray)
    removed += sum(driver.delete_foreign(line) for line in seen.foreign)
    return {"removed": removed}
