"""The host's answer to `gpuaas slot rewipe NODE SLOT`: start a blocked slot's cleanup over.

Accepted only for a slot this host holds as cleanup-blocked for a release its
plan still carries: the block is lifted (the failed attempt's evidence kept
under `previous`) and the same pass runs wipe, verify, the health step and
report_free, through the same guards as any release. Anything else is
refused with a stable code, and nothing changes: a slot that is not blocked
(it may be serving a tenant), or whose release left the plan (lifting that
block would report a slot free that nobody wiped).
"""

from __future__ import annotations

from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler.localstate import LocalState
from schemas.hostplans import HostPlan

ACCEPTED, REFUSED = "accepted", "refused"


def answer(state: LocalState, plan: HostPlan, slot: int) -> tuple[str, dict[str, Any]]:
    rec = state.read_wipes().get(slot)
    if rec is None or not rec.blocked:
        return REFUSED, {
            "code": host_codes.REWIPE_NOT_BLOCKED,
            "message": f"slot {slot} is not cleanup_blocked on {plan.node}; nothing to rewipe",
        }
    releases = {vm.allocation_id for vm in plan.releases if any(b.slot_index == slot for b in vm.bundles)}
    if rec.allocation_id not in releases:
        return REFUSED, {
            "code": host_codes.REWIPE_NO_RELEASE,
            "message": f"slot {slot} was blocked for {rec.allocation_id}, whose release is no longer "
            "in this host's plan",
        }
    state.rewipe(slot)
    return ACCEPTED, {
        "allocation_id": rec.allocation_id,
        "was_blocked": rec.blocked,
        "message": "block lifted: wipe, verify and the health step run in this pass",
    }
