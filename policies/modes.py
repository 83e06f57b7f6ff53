"""Node mode: capability plus occupancy plus admin intent, and the transitions.

Seed 000 ("Mixed Node State", "Mixed Node Transitions"): a node's mode is
derived, never stored. Capability comes from `policies.capability` (tag AND
firmware ready AND approved slots); occupancy comes from live claims; admin
intent (draining, maintenance) and health override both. `transition()`
answers the seed's table: may a node in this state go to that use, and if
not, which stable code says why.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from desired import models as m
from policies import codes as policies_codes
from policies.capability import Capability


class Mode(enum.StrEnum):
    BAREMETAL_ONLY = "baremetal_only"
    SLICE_CANDIDATE = "slice_candidate"
    BOTH_CAPABLE = "both_capable"
    SLICE_ACTIVE = "slice_active"
    BAREMETAL_ACTIVE = "baremetal_active"
    DRAINING = "draining"
    CLEANUP_BLOCKED = "cleanup_blocked"
    UNAVAILABLE = "unavailable"


class Occupancy(enum.StrEnum):
    EMPTY = "fully_available"
    PARTIAL = "partially_allocated"
    FULL = "fully_allocated"
    EXCLUSIVE = "baremetal_active"


class Target(enum.StrEnum):
    """Where a transition wants the node to go."""

    SLICE_USE = "slice_use"
    BAREMETAL_USE = "baremetal_use"
    SHARE_STORAGE = "share_storage"  # back to host share / baremetal storage layout
    DRAINING = "draining"
    UNAVAILABLE = "unavailable"
    CLEANUP_BLOCKED = "cleanup_blocked"  # a slot's cleanup failed
    AVAILABLE = "available"  # back to service after repair or probe


# Stable reason codes. Do not change the string values.
NOT_SLICE_CAPABLE = policies_codes.NODE_MODE_NOT_SLICE_CAPABLE
STORAGE_NOT_SLICE = policies_codes.NODE_MODE_STORAGE_NOT_SLICE
NO_FREE_SLOTS = policies_codes.NODE_MODE_NO_FREE_SLOTS
BAREMETAL_ACTIVE = policies_codes.NODE_MODE_BAREMETAL_ACTIVE
SLICE_ACTIVE = policies_codes.NODE_MODE_SLICE_ACTIVE
CLEANUP_PENDING = policies_codes.NODE_MODE_CLEANUP_PENDING
CLEANUP_BLOCKED = policies_codes.NODE_MODE_CLEANUP_BLOCKED
DRAINING = policies_codes.NODE_MODE_DRAINING
MAINTENANCE = policies_codes.NODE_MODE_MAINTENANCE
UNAVAILABLE = policies_codes.NODE_MODE_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class ModeFacts:
    """What a node's mode and its transitions are derived from, at one moment (desired state + observed)."""

    capability: Capability
    admin_state: m.AdminState = m.AdminState.ACTIVE
    healthy: bool = True
    storage_mode: m.StorageMode = m.StorageMode.SLICE
    slot_claims: int = 0  # live slot claims (reserved .. releasing)
    exclusive_claim: bool = False  # a live node_exclusive (baremetal) claim
    cleanup_slots: int = 0  # released slots still waiting for cleanup proof
    blocked_slots: int = 0  # slots whose cleanup failed
    free_slots: int = 0  # eligible slots neither claimed nor blocked
    node_corrupt: bool = False  # health evidence of node-wide corruption


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    code: str = ""
    message: str = ""
    scope: str = "node"  # "slot" when only the affected slots are blocked


ALLOWED = Verdict(True)


def occupancy(f: ModeFacts) -> Occupancy:
    if f.exclusive_claim:
        return Occupancy.EXCLUSIVE
    if f.slot_claims == 0:
        return Occupancy.EMPTY
    return Occupancy.FULL if f.free_slots == 0 else Occupancy.PARTIAL


def mode(f: ModeFacts) -> Mode:
    """The one mode an operator sees; health and admin intent come first."""
    if not f.healthy or f.node_corrupt or f.admin_state is m.AdminState.MAINTENANCE:
        return Mode.UNAVAILABLE
    if f.admin_state is m.AdminState.DRAINING:
        return Mode.DRAINING
    if f.exclusive_claim:
        return Mode.BAREMETAL_ACTIVE
    if f.slot_claims:
        return Mode.SLICE_ACTIVE
    if f.blocked_slots:
        return Mode.CLEANUP_BLOCKED
    return Mode(f.capability.value)


def _admin(f: ModeFacts) -> Verdict | None:
    if f.node_corrupt:
        return Verdict(False, UNAVAILABLE, "health evidence shows node-wide corruption")
    if not f.healthy:
        return Verdict(False, UNAVAILABLE, "node is failing health checks")
    if f.admin_state is m.AdminState.MAINTENANCE:
        return Verdict(False, MAINTENANCE, "node is in maintenance; it takes nothing new")
    if f.admin_state is m.AdminState.DRAINING:
        return Verdict(False, DRAINING, "node is draining; existing allocations continue, nothing new is placed")
    return None


def _to_slice(f: ModeFacts) -> Verdict:
    if f.exclusive_claim:
        return Verdict(
            False, BAREMETAL_ACTIVE, "a baremetal allocation holds the node; slices wait for its release and reimage"
        )
    if f.storage_mode is not m.StorageMode.SLICE:
        return Verdict(
            False,
            STORAGE_NOT_SLICE,
            "host share storage is mounted; drain, unmount or remap and approve destructive slice ownership first",
        )
    if f.capability is not Capability.BOTH_CAPABLE:
        return Verdict(
            False,
            NOT_SLICE_CAPABLE,
            f"node is {f.capability.value}: needs the slice tag, ready firmware and approved slots",
        )
    if f.free_slots == 0:
        return Verdict(False, NO_FREE_SLOTS, "no free approved slot")
    return ALLOWED


def _to_baremetal(f: ModeFacts) -> Verdict:
    if f.exclusive_claim:
        return Verdict(False, BAREMETAL_ACTIVE, "another baremetal allocation holds the node")
    if f.slot_claims:
        return Verdict(
            False,
            SLICE_ACTIVE,
            f"{f.slot_claims} slice claim(s) live; baremetal waits until every one releases and cleanup passes",
        )
    if f.cleanup_slots or f.blocked_slots:
        n = f.cleanup_slots + f.blocked_slots
        code = CLEANUP_BLOCKED if f.blocked_slots else CLEANUP_PENDING
        return Verdict(False, code, f"{n} slot(s) have no cleanup proof yet")
    return ALLOWED


def _always(f: ModeFacts) -> Verdict:
    # Health failure always wins (billing policy decides about live allocations), and an
    # admin drain is non-disruptive: placement stops, live allocations continue.
    return ALLOWED


def _to_cleanup_blocked(f: ModeFacts) -> Verdict:
    if f.node_corrupt:
        return Verdict(True, UNAVAILABLE, "node-wide corruption: the whole node is blocked", scope="node")
    return Verdict(True, CLEANUP_BLOCKED, "only the affected slot is blocked", scope="slot")


def _to_available(f: ModeFacts) -> Verdict:
    if f.blocked_slots:
        return Verdict(
            False, CLEANUP_BLOCKED, f"{f.blocked_slots} slot(s) stay blocked until an admin repair or a passing probe"
        )
    return _admin(f) or ALLOWED


def _to_share_storage(f: ModeFacts) -> Verdict:
    if f.slot_claims or f.cleanup_slots or f.blocked_slots:
        return Verdict(
            False, SLICE_ACTIVE, "every slice claim must release and pass cleanup before infra remounts share storage"
        )
    return ALLOWED


def _placing(check: Callable[[ModeFacts], Verdict]) -> Callable[[ModeFacts], Verdict]:
    def verdict(f: ModeFacts) -> Verdict:
        return _admin(f) or check(f)

    return verdict


_TRANSITIONS: dict[Target, Callable[[ModeFacts], Verdict]] = {
    Target.UNAVAILABLE: _always,
    Target.DRAINING: _always,
    Target.CLEANUP_BLOCKED: _to_cleanup_blocked,
    Target.AVAILABLE: _to_available,
    Target.SHARE_STORAGE: _to_share_storage,
    Target.SLICE_USE: _placing(_to_slice),
    Target.BAREMETAL_USE: _placing(_to_baremetal),
}


def transition(f: ModeFacts, target: Target) -> Verdict:
    """May the node go to `target` now? Rows of seed 000's transition table."""
    return _TRANSITIONS[target](f)
