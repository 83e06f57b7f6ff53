"""What the host reconciler saw on its node: the input of `diff` beside the plan.

Plain frozen values filled by `observing.observe` from the drivers and the
local state directory. Nothing here does I/O, so `diff` tests build these by
hand, one table row per story.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from host_reconciler.domains import DomainFacts
from host_reconciler.imagecache import CacheEntry, PartialFetch
from schemas.hostplans import IngressRule


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


class DomainState(enum.StrEnum):
    RUNNING = "running"
    SHUTOFF = "shutoff"
    PAUSED = "paused"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class DomainObs:
    facts: DomainFacts
    state: DomainState

    @property
    def running(self) -> bool:
        return self.state in (DomainState.RUNNING, DomainState.PAUSED)


@dataclass(frozen=True, slots=True)
class ReservationObs:
    name: str
    mac: str
    ip: str


@dataclass(frozen=True, slots=True)
class DiskObs:
    """One approved slot disk (only probed for signatures when the slot is free)."""

    device: str  # the approved /dev/disk/by-id path
    present: bool
    mounted: tuple[str, ...] = ()  # mount points of it or its partitions
    signatures: tuple[str, ...] | None = None  # None: not probed (disk in use)
    os_disk: bool = False


@dataclass(frozen=True, slots=True)
class PciObs:
    address: str
    present: bool
    driver: str | None = None
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    ms: float
    finished_at: str


@dataclass(frozen=True, slots=True)
class Failure:
    phase: str
    code: str
    message: str
    generation: int


@dataclass(frozen=True, slots=True)
class Progress:
    """The local journal of one allocation: phases proven done, with timings."""

    allocation_id: str
    spec_digest: str
    done: Mapping[str, PhaseRecord] = field(default_factory=_empty)
    failed: Failure | None = None
    hard_stopped: bool = False


@dataclass(frozen=True, slots=True)
class WipeRecord:
    """Evidence of one slot's cleanup for one released allocation."""

    slot_index: int
    allocation_id: str
    wiped: bool
    verified: bool
    blocked: str | None = None  # reason; the slot stays cleanup_blocked
    evidence: Mapping[str, Any] = field(default_factory=_empty)

    @property
    def healthy(self) -> bool:
        """The slot health step passed after this wipe (its evidence, under "slot_health", says ok)."""
        health = self.evidence.get("slot_health")
        return isinstance(health, Mapping) and health.get("ok") is True


@dataclass(frozen=True, slots=True)
class GateFinding:
    """A discovery-gate difference between this host and its approved SlotMap."""

    slot_index: int | None
    code: str
    message: str
    expected: str | None = None
    observed: str | None = None


@dataclass(frozen=True, slots=True)
class IngressSeen:
    """The host's ingress rules as read back (iptables -S of our chains), parsed.

    `dnat` and `forward` hold the rules we wrote (tagged `gpuaas-ingress:<allocation>`),
    one half each: a public endpoint works only with both. `foreign` holds every
    other rule found in our chains, as iptables prints it; `hooked` says whether
    PREROUTING and FORWARD still jump to our chains.
    """

    dnat: tuple[IngressRule, ...] = ()
    forward: tuple[IngressRule, ...] = ()
    foreign: tuple[str, ...] = ()
    hooked: bool = True

    @property
    def complete(self) -> frozenset[IngressRule]:
        """Endpoints that answer: both halves present, and our chains reached."""
        return frozenset(self.dnat) & frozenset(self.forward) if self.hooked else frozenset()

    @property
    def written(self) -> frozenset[IngressRule]:
        """Every endpoint with at least one half present."""
        return frozenset(self.dnat) | frozenset(self.forward)


@dataclass(frozen=True, slots=True)
class HostObservation:
    """What one pass read from this host (drivers, state dir, discovery gate): the input of `diff`."""

    domains: Mapping[str, DomainObs] = field(default_factory=_empty)  # gpuaas-* only, by name
    reservations: Mapping[str, ReservationObs] = field(default_factory=_empty)  # by VM name
    disks: Mapping[int, DiskObs] = field(default_factory=_empty)  # by slot_index
    pci: Mapping[str, PciObs] = field(default_factory=_empty)  # by address
    leases: Mapping[int, str] = field(default_factory=_empty)  # slot_index -> allocation id
    seeds: Mapping[str, str] = field(default_factory=_empty)  # VM name -> spec digest
    progress: Mapping[str, Progress] = field(default_factory=_empty)  # provision journal, by allocation id
    release_progress: Mapping[str, Progress] = field(default_factory=_empty)  # release journal
    wipes: Mapping[int, WipeRecord] = field(default_factory=_empty)  # by slot_index (latest)
    gate: tuple[GateFinding, ...] = ()
    gate_ran: bool = False
    network: tuple[str, ...] = ()  # management network problems (bridge, NAT, port isolation)
    images: Mapping[str, CacheEntry] = field(default_factory=_empty)  # the image cache, by sha256 hex
    image_fetches: tuple[PartialFetch, ...] = ()  # downloads left unfinished (resumed by image_fetch)
    ingress: IngressSeen | None = None  # None: no ingress driver (rules managed elsewhere, or not at all)
