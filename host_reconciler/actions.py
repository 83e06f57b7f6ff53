"""Host actions and drift: the values `diff` returns and the engine applies.

A provision walks the phases of seed 002 section 6, a release those of
section 9. Every phase is idempotent: the engine may run it again after a
crash, and `diff` only lists the phases that observation cannot prove done.
Drift heals (self-heal mode) reuse the same steps.

Drift codes are stable ("Do not change the string values. Once set, they
are set."): operators filter and alert on them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Step(enum.StrEnum):
    # provision (seed 002 section 6)
    LEASE = "lease"
    HOST_CHECKS = "host_checks"
    VFIO_CHECK = "vfio_check"
    IMAGE_FETCH = "image_fetch"
    IMAGE_VERIFY = "image_verify"
    CLOUD_INIT_SEED = "cloud_init_seed"
    DHCP_RESERVATION = "dhcp_reservation"
    DISK_WRITE = "disk_write"
    DEFINE_START = "define_start"
    INGRESS = "ingress"  # the VM's public endpoints (DNAT + forward), before readiness passes
    READINESS = "readiness"
    # release (seed 002 section 9)
    GRACEFUL_STOP = "graceful_stop"
    HARD_STOP = "hard_stop"
    UNDEFINE = "undefine"
    REMOVE_RESERVATION = "remove_reservation"
    REMOVE_INGRESS = "remove_ingress"  # before the wipe: no port leads to a disk being wiped
    WIPE = "wipe"
    VERIFY = "verify"
    SLOT_HEALTH = "slot_health"  # reset the slot's GPU and VF, prove them back on vfio-pci, unchanged
    REPORT_FREE = "report_free"
    # drift heals (self-heal mode only)
    START_DOMAIN = "start_domain"
    REDEFINE_DOMAIN = "redefine_domain"
    REMOVE_ORPHAN_DOMAIN = "remove_orphan_domain"
    REMOVE_STALE_RESERVATION = "remove_stale_reservation"
    REMOVE_ORPHAN_SEED = "remove_orphan_seed"
    REMOVE_ORPHAN_LEASE = "remove_orphan_lease"
    REMOVE_STRAY_INGRESS = "remove_stray_ingress"


PROVISION_STEPS: tuple[Step, ...] = (
    Step.LEASE,
    Step.HOST_CHECKS,
    Step.VFIO_CHECK,
    Step.IMAGE_FETCH,
    Step.IMAGE_VERIFY,
    Step.CLOUD_INIT_SEED,
    Step.DHCP_RESERVATION,
    Step.DISK_WRITE,
    Step.DEFINE_START,
    Step.INGRESS,
    Step.READINESS,
)
RELEASE_STEPS: tuple[Step, ...] = (
    Step.GRACEFUL_STOP,
    Step.HARD_STOP,
    Step.UNDEFINE,
    Step.REMOVE_RESERVATION,
    Step.REMOVE_INGRESS,
    Step.WIPE,
    Step.VERIFY,
    Step.SLOT_HEALTH,
    Step.REPORT_FREE,
)
PER_SLOT_STEPS = frozenset({Step.WIPE, Step.VERIFY, Step.SLOT_HEALTH, Step.REPORT_FREE})
# A permanent failure of one of these blocks that slot only (cleanup_blocked, with the evidence).
SLOT_BLOCKING_STEPS = frozenset({Step.WIPE, Step.VERIFY, Step.SLOT_HEALTH})


class Flow(enum.StrEnum):
    PROVISION = "provision"
    RELEASE = "release"
    HEAL = "heal"


class DriftMode(enum.StrEnum):
    REPORT = "report"
    SELF_HEAL = "self-heal"


@dataclass(frozen=True, slots=True)
class Action:
    flow: Flow
    step: Step
    allocation_id: str  # for orphans, the allocation read from the domain metadata (or "")
    slot_indexes: tuple[int, ...] = ()
    target: str = ""  # the domain, reservation, seed or lease name a heal acts on
    reason: str = ""

    def describe(self) -> str:
        slots = ",".join(str(s) for s in self.slot_indexes)
        where = f" slots={slots}" if slots else ""
        target = f" target={self.target}" if self.target else ""
        why = f"  # {self.reason}" if self.reason else ""
        return f"{self.flow}:{self.step} {self.allocation_id or '-'}{where}{target}{why}"


class DriftCode(enum.StrEnum):
    DOMAIN_MISSING = "drift.domain.missing"
    DOMAIN_NOT_RUNNING = "drift.domain.not_running"
    DOMAIN_UNEXPECTED = "drift.domain.unexpected"
    DOMAIN_DEVICES = "drift.domain.devices"
    DOMAIN_SPEC_CHANGED = "drift.domain.spec_changed"
    RESERVATION_MISSING = "drift.reservation.missing"
    RESERVATION_STALE = "drift.reservation.stale"
    DISK_MISSING = "drift.disk.missing"
    DISK_MOUNTED = "drift.disk.mounted"
    DISK_SIGNATURE = "drift.disk.signature_present"
    DISK_OS = "drift.disk.os_disk"
    PCI_NOT_VFIO = "drift.pci.not_vfio"
    PCI_MISSING = "drift.pci.missing"
    IDENTITY_CHANGED = "drift.identity.changed"
    NETWORK = "drift.network.problem"
    LEASE_ORPHAN = "drift.lease.orphan"
    LEASE_MISSING = "drift.lease.missing"
    SEED_ORPHAN = "drift.seed.orphan"
    SEED_MISSING = "drift.seed.missing"
    INGRESS_MISSING = "drift.ingress.missing"
    INGRESS_EXTRA = "drift.ingress.extra"
    INGRESS_FOREIGN = "drift.ingress.foreign"


# Drift that takes a slot out of sale until an operator (or git) acts.
BLOCKING_DRIFT = frozenset(
    {
        DriftCode.DISK_MISSING,
        DriftCode.DISK_MOUNTED,
        DriftCode.DISK_SIGNATURE,
        DriftCode.DISK_OS,
        DriftCode.PCI_NOT_VFIO,
        DriftCode.PCI_MISSING,
        DriftCode.IDENTITY_CHANGED,
    }
)


@dataclass(frozen=True, slots=True)
class Drift:
    code: DriftCode
    slot_index: int | None
    message: str
    allocation_id: str | None = None
    expected: str | None = None
    observed: str | None = None
    heal: Step | None = None  # what self-heal mode would do; None: report only
    subject: str | None = None  # the domain, reservation or seed name a heal acts on

    def as_dict(self) -> dict[str, object]:
        return {
            "code": str(self.code),
            "slot_index": self.slot_index,
            "message": self.message,
            "allocation_id": self.allocation_id,
            "expected": self.expected,
            "observed": self.observed,
            "heal": str(self.heal) if self.heal else None,
            "subject": self.subject,
        }
