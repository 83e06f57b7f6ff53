"""The release steps: stop the domain (gracefully, then hard), undefine it, drop its
DHCP reservation and seed, then per slot wipe, verify, prove the devices healthy
and free the slot.

A slot is freed only on a verified wipe of the allocation that held it and a
passed health step (seed 000 "Isolation and Cleanup": reset GPU/network
devices where supported, validate the slot, then mark it available). A
defined domain that still names the disk or a device postpones the step; a
permanent wipe, verify or health refusal makes the slot cleanup-blocked
(`converging`), with the evidence.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler.actions import Action, Step
from host_reconciler.context import Context, Result, one_slot, require_vm
from host_reconciler.drivers.protocols import VFIO, PciError
from host_reconciler.observations import DomainState
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import SlotBundle, VmSpec


def _running(state: DomainState | None) -> bool:
    return state in (DomainState.RUNNING, DomainState.PAUSED)


def graceful_stop(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    dd = ctx.drivers.domains
    if not _running(dd.state(v.name)):
        return {"graceful": True, "waited_s": 0.0}
    dd.shutdown(v.name)
    t0 = ctx.clock()
    deadline = t0 + ctx.plan.shutdown_timeout_s
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
        raise TemporaryError(f"{v.name} is still running; not undefining it", code=host_codes.DOMAIN_STILL_RUNNING)
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
            code=host_codes.DISK_IN_USE_BY_DOMAIN,
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


class HealthFailed(PermanentError):
    """A slot's device did not come back healthy: the slot is blocked with this evidence."""

    code = host_codes.HEALTH_FAILED

    def __init__(self, message: str, *, code: str, evidence: dict[str, Any]) -> None:
        super().__init__(message, code=code)
        self.evidence = evidence


def claimed_devices(vm: VmSpec, slot: int) -> tuple[tuple[str, str], ...]:
    """(role, PCI address) of the devices the claim gives slot `slot`: its GPU, then its fabric VF."""
    bundle: SlotBundle | None = next((b for b in vm.bundles if b.slot_index == slot), None)
    if bundle is None:
        return ()
    out = [("gpu", bundle.gpu_pci_address)]
    if bundle.fabric_vf_pci_address:
        out.append(("fabric_vf", bundle.fabric_vf_pci_address))
    return tuple(out)


def reset_claimed(ctx: Context, vm: VmSpec, slot: int, address: str) -> dict[str, Any]:
    """The only way a step resets a device: refused unless `address` is in the claim of `slot`."""
    if address not in {a for _, a in claimed_devices(vm, slot)}:
        raise PciError(
            f"slot {slot}: {address} is not a device of {vm.allocation_id}'s claim; not resetting it",
            code=host_codes.HEALTH_NOT_CLAIMED,
        )
    return ctx.drivers.pci.reset(address)


def slot_health(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    """Reset the slot's GPU and VF where they support it; prove each is back on vfio-pci with its ids unchanged."""
    v = require_vm(vm, action)
    slot = one_slot(action)
    devices = claimed_devices(v, slot)
    holders = sorted(
        n for n, d in ctx.drivers.domains.domains().items() if any(a in d.facts.hostdevs for _, a in devices)
    )
    if holders:  # a defined domain still names the device: never reset under it
        raise TemporaryError(
            f"slot {slot}: its devices belong to domain(s) {', '.join(holders)}",
            code=host_codes.HEALTH_IN_USE_BY_DOMAIN,
            delay=5.0,
        )
    journal = ctx.state.read_journal(v.allocation_id)
    if journal and str(Step.DEFINE_START) not in (journal.get("done") or {}):
        # Provisioning stopped before any domain got these devices (a failed check, a bad image):
        # nothing of the tenant's touched them, and the failure's own code already judged the slot.
        ctx.state.write_wipe(
            slot,
            v.allocation_id,
            wiped=True,
            verified=True,
            blocked=None,
            evidence={"slot_health": {"ok": True, "skipped": "the devices were never given to a VM", "devices": []}},
        )
        return {"skipped": True}
    t0 = ctx.clock()
    found: list[dict[str, Any]] = []
    evidence: dict[str, Any] = {"ok": False, "devices": found}
    for role, address in devices:
        entry: dict[str, Any] = {"role": role, "address": address}
        found.append(entry)
        before = ctx.drivers.pci.identity(address)
        first = ctx.drivers.pci.inspect(address)
        if before is None or not first.present:
            raise HealthFailed(
                f"slot {slot}: {role} {address} is not on the PCI bus",
                code=host_codes.HEALTH_DEVICE_MISSING,
                evidence=evidence,
            )
        entry["identity"] = before.as_dict()
        if first.driver != VFIO:  # a host driver holds it: never reset a device the host uses
            entry["driver"] = first.driver
            raise HealthFailed(
                f"slot {slot}: {role} {address} is on {first.driver or 'no driver'}, not {VFIO}; not resetting it",
                code=host_codes.HEALTH_NOT_VFIO,
                evidence=evidence,
            )
        t = ctx.clock()
        try:
            entry.update(reset_claimed(ctx, v, slot, address))
        except PciError as e:
            entry["error"] = e.message
            raise HealthFailed(f"slot {slot}: {role} {address}: {e.message}", code=e.code, evidence=evidence) from e
        entry["reset_ms"] = round((ctx.clock() - t) * 1000, 3)
        after, now = ctx.drivers.pci.inspect(address), ctx.drivers.pci.identity(address)
        entry["driver"] = after.driver
        if not after.present or now is None:
            raise HealthFailed(
                f"slot {slot}: {role} {address} left the bus after its reset",
                code=host_codes.HEALTH_DEVICE_LOST,
                evidence=evidence,
            )
        if after.driver != VFIO:
            raise HealthFailed(
                f"slot {slot}: {role} {address} is on {after.driver or 'no driver'} after its reset, not {VFIO}",
                code=host_codes.HEALTH_NOT_VFIO,
                evidence=evidence,
            )
        if now != before:
            entry["identity_after"] = now.as_dict()
            raise HealthFailed(
                f"slot {slot}: {role} {address} changed identity across its reset",
                code=host_codes.HEALTH_IDENTITY_CHANGED,
                evidence=evidence,
            )
    evidence.update(
        ok=True,
        ms=round((ctx.clock() - t0) * 1000, 3),
        checked_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    ctx.state.write_wipe(
        slot, v.allocation_id, wiped=True, verified=True, blocked=None, evidence={"slot_health": evidence}
    )
    return {"devices": len(found), "ms": evidence["ms"]}


def report_free(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    slot = one_slot(action)
    rec = ctx.state.read_wipes().get(slot)
    if rec is None or rec.allocation_id != v.allocation_id or not rec.verified:
        raise PermanentError(f"slot {slot} has no verified wipe for {v.allocation_id}", code=host_codes.WIPE_UNPROVEN)
    if not rec.healthy:
        raise PermanentError(
            f"slot {slot} has not passed its health step for {v.allocation_id}", code=host_codes.HEALTH_UNPROVEN
        )
    ctx.state.release_lease(slot, v.allocation_id)
    return {}
