"""A node's mode as of the engine's present claims (`policies.modes` decides it from these facts)."""

from __future__ import annotations

from policies import modes
from reconciler.placement.fleetstate import FleetState
from schemas import states


def mode_facts(state: FleetState, name: str) -> modes.ModeFacts:
    """The facts `policies.modes` derives a node's mode from, as of now."""
    node = state.by_name[name]
    f = node.facts
    claimed = node.claimed
    slot_claims = 0 if node.exclusive else claimed.bit_count()
    sellable = sum(1 for p, s in enumerate(f.slots) if s.sellable and not claimed >> p & 1)
    return modes.ModeFacts(
        capability=f.capability.capability,
        admin_state=f.admin_state,
        healthy=f.healthy,
        storage_mode=f.storage_mode,
        slot_claims=slot_claims,
        exclusive_claim=node.exclusive is not None,
        cleanup_slots=sum(1 for s in f.slots if s.status is states.SlotStatus.CLEANUP),
        blocked_slots=sum(1 for s in f.slots if s.status is states.SlotStatus.CLEANUP_BLOCKED),
        free_slots=0 if node.exclusive else sellable,
        node_corrupt=bool(f.corrupt),
    )


def mode(state: FleetState, name: str) -> modes.Mode:
    return modes.mode(mode_facts(state, name))
