"""Plan values: what `planner.plan(desired, observed)` returns, and its inputs.

This is the contract between the pure planner and the imperative shell
(`apply` writes placements as claims; `plan`/`status` render them). Frozen
dataclasses only; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from policies import profiles
from schemas.states import ClaimKind, ClaimStatus, SlotStatus

if TYPE_CHECKING:
    from desired.state import Delta, DesiredState

SlotKey = tuple[str, int]  # (node name, slot_index)


@dataclass(frozen=True, slots=True)
class ExistingClaim:
    """A live claim recorded in the store (input to the planner)."""

    allocation_id: str
    node: str
    kind: ClaimKind
    slot_index: int | None  # None for node_exclusive
    status: ClaimStatus
    tenant: str = ""


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Observed:
    """Facts the planner cannot read from git, passed in as plain data.

    - claims: every live claim (reserved..releasing);
    - slot_status: slots that are not simply available or claimed
      (cleanup, cleanup_blocked, failed, disabled); absent means available;
    - firmware_ready: host-reported firmware readiness; overrides the
      onboarding evidence in the Node document when present;
    - unavailable_nodes: nodes failing health checks;
    - placed: allocation ids that already hold claims (never placed twice);
    - avoid: per allocation, the nodes where an earlier attempt failed for
      good (a reschedule never goes back there);
    - image_cache: per node, the sha256 digests its host reported cached
      (`node_image_cache`, 0052), for placement's tie-break among equally
      packed candidates (never a reason to pack worse);
    - slot_blocks: slots their host reports drifted or unschedulable, with
      the codes (`policies.hostreports`): not placed until reported clear;
    - corrupt_nodes: nodes whose host reports node-wide corruption, with the
      evidence codes: the whole node takes nothing new.
    """

    claims: tuple[ExistingClaim, ...] = ()
    slot_status: Mapping[SlotKey, SlotStatus] = field(default_factory=_empty)
    firmware_ready: Mapping[str, bool] = field(default_factory=_empty)
    unavailable_nodes: frozenset[str] = frozenset()
    placed: frozenset[str] = frozenset()
    avoid: Mapping[str, frozenset[str]] = field(default_factory=_empty)
    image_cache: Mapping[str, frozenset[str]] = field(default_factory=_empty)
    slot_blocks: Mapping[SlotKey, tuple[str, ...]] = field(default_factory=_empty)
    corrupt_nodes: Mapping[str, tuple[str, ...]] = field(default_factory=_empty)


# The VM profile snapshot: later SKU edits never change a running allocation.
# One type for the policy that resolves it and the plan that carries it.
ResolvedProfile = profiles.Profile


@dataclass(frozen=True, slots=True)
class Candidate:
    node: str
    slot_indexes: tuple[int, ...]  # empty for a baremetal lease


@dataclass(frozen=True, slots=True)
class Placement:
    allocation_id: str
    tenant: str
    sku: str
    capacity_shape: str  # "baremetal" | "gpu_slice"
    gpu_count: int
    region: str
    node: str
    slot_indexes: tuple[int, ...]  # every slot of the node for baremetal (all blocked)
    profile: ResolvedProfile | None
    image: str | None
    # Next-best candidates, in order, for apply to try after a lost race.
    alternatives: tuple[Candidate, ...] = ()

    @property
    def claim_kind(self) -> ClaimKind:
        return ClaimKind.NODE_EXCLUSIVE if self.capacity_shape == "baremetal" else ClaimKind.SLOT


@dataclass(frozen=True, slots=True)
class Pending:
    """An allocation that cannot be placed now, with a stable code and a sentence."""

    allocation_id: str
    code: str
    message: str
    details: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class Release:
    allocation_id: str
    node: str
    slot_indexes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    pending: tuple[Pending, ...] = ()
    releases: tuple[Release, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.placements or self.pending or self.releases)


class Planner(Protocol):
    """Plans a desired state against observed claims (`reconciler.placement.planner.plan` with a policy fixed).

    `delta`: how the reader built `desired` from the state before it, when it
    did; a planner that keeps its engine between calls works from the change
    (`replanning.WarmPlanner`), any other ignores it.
    """

    def __call__(self, desired: DesiredState, observed: Observed, delta: Delta | None = None, /) -> Plan: ...
