"""Claim and slot states, spelled as the SQL domains spell them (schemas/sql).

Shared by the central reconciler (which writes claims) and the host agent
(which reports slot states); tests/claims check them against the domains.
"""

from __future__ import annotations

import enum


class ClaimKind(enum.StrEnum):
    NODE_EXCLUSIVE = "node_exclusive"
    SLOT = "slot"


class ClaimStatus(enum.StrEnum):
    RESERVED = "reserved"
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    RELEASING = "releasing"
    RELEASED = "released"
    FAILED = "failed"


LIVE_CLAIM_STATUSES = frozenset(
    {
        ClaimStatus.RESERVED,
        ClaimStatus.PROVISIONING,
        ClaimStatus.ACTIVE,
        ClaimStatus.RELEASING,
    }
)


class SlotStatus(enum.StrEnum):
    AVAILABLE = "available"
    RESERVED = "reserved"
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    RELEASING = "releasing"
    CLEANUP = "cleanup"
    CLEANUP_BLOCKED = "cleanup_blocked"
    FAILED = "failed"
    DISABLED = "disabled"
    QUARANTINED = "quarantined"  # a permanent provision failure; only an operator clears it
