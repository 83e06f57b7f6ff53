"""The placement engine: one in-memory fleet, placing and releasing requests.

`Engine` is built once from desired state plus observed facts, then answers
`place(request)` and `release(allocation_id)` in time independent of the
fleet size (see `reconciler.placement.index`). `planner.plan()` and the
simulator both drive this class, so what the simulator measures is what the
planner does.

It is the facade over the engine's parts, one job each:

  fleetstate   nodes, claims, partitions and indexes; warm upkeep between revisions
  picking      which node a request gets (tiers; one `strategies` object per policy shape)
  counting     how many requests of one shape fit (the capacity read model)
  explaining   why a request is refused
  nodestatus   the facts a node's mode is derived from

Callers read nodes through `fleetstate.NodeView` and never change them but
through the engine's methods.

Pure: no I/O, no clock, no randomness; same inputs and same call sequence
give the same answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from desired import models as m
from desired.state import DesiredState
from policies import modes, packing
from policies import topology as t
from reconciler import plans
from reconciler.placement import fleetgraph, nodestatus, requests
from reconciler.placement.counting import FitCounter
from reconciler.placement.explaining import Explainer
from reconciler.placement.fleetstate import FleetState, NodeView
from reconciler.placement.index import SliceIndex
from reconciler.placement.picking import Picker

# The vocabulary of the engine, for its callers (defined in `requests`).
Refused = requests.Refused
Request = requests.Request
Placed = requests.Placed
Spec = requests.Spec
Tier = requests.Tier
lease_end = requests.lease_end
claim_order = requests.claim_order

Pool = tuple[str, str]  # (region, pool): where a node is declared
# Asked, when a request's pick would open an empty host of a pool, whether to hold it back (`Engine.place`).
Hold = Callable[[Pool], Refused | None]

DEFAULT_SHARES: Mapping[int, float] = MappingProxyType({1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15})


def policy_of(desired: DesiredState, policy: str | None = None) -> packing.Policy:
    """The packing policy: `policy` (an override), else the fleet's; ValueError naming the known ones."""
    fleet = desired.fleet
    name = policy or (fleet.placement.policy if fleet else packing.Policy.DEFAULT.value)
    try:
        return packing.Policy(name)
    except ValueError:
        known = ", ".join(p.value for p in packing.ALL)
        raise ValueError(f"unknown placement policy {name!r}; known: {known}") from None


class Engine:
    """Placement state of one fleet under one policy."""

    def __init__(
        self,
        desired: DesiredState,
        observed: plans.Observed | None = None,
        *,
        policy: str | None = None,
        shares: Mapping[int, float] | None = None,
    ) -> None:
        fleet = desired.fleet
        self.policy = policy_of(desired, policy)
        if shares is None:
            shares = fleet.placement.workload_mix if fleet else DEFAULT_SHARES
        # The parts below share this state; tests read it, callers go through the methods here.
        self.state = FleetState(
            desired,
            observed or plans.Observed(),
            policy=self.policy,
            shares=shares,
            lease_end_weight=(fleet.placement if fleet else m.PlacementSettings()).lease_end_weight,
        )
        self._specs = requests.Specs(desired.skus)
        self._picker = Picker(self.state)
        self._explainer = Explainer(self.state, self._specs)
        self._counter = FitCounter(self.state, self._specs, self._explainer)

    # ------------------------------------------------------------ reading

    @property
    def skus(self) -> dict[str, m.Sku]:
        return self.state.skus

    @property
    def shares(self) -> dict[int, float]:
        return self.state.shares

    @property
    def lease_end_weight(self) -> float:
        return self.state.lease_end_weight

    @property
    def warnings(self) -> list[str]:
        """What loading the observed claims found wrong (unknown nodes or slots, split allocations)."""
        return self.state.warnings

    @property
    def facts(self) -> tuple[fleetgraph.NodeFacts, ...]:
        """Every node's facts, in node order."""
        return self.state.facts

    @property
    def nodes(self) -> Sequence[NodeView]:
        """Every node, in node order (the last tie-break)."""
        return self.state.nodes

    @property
    def by_name(self) -> Mapping[str, NodeView]:
        return self.state.by_name

    @property
    def where(self) -> Mapping[str, NodeView]:
        """Allocation id -> the node holding it."""
        return self.state.where

    @property
    def empty_nodes(self) -> int:
        """Nodes with no claim at all."""
        return self.state.empty_nodes

    def empty_hosts(self, pool: Pool) -> int:
        """Hosts of one pool with no claim that a whole-host request could take (active, cleaned, undrifted)."""
        return self.state.empty_hosts.get(pool, 0)

    def pools(self, sku_name: str, region: str, tenant: str) -> frozenset[Pool]:
        """The pools holding a node a request of this SKU could take once it is empty (any tier).

        Walks every node: callers keep the answer while `facts_version` stays the same.
        """
        sku = self.state.skus.get(sku_name)
        if sku is None:
            return frozenset()
        if sku.capacity_shape is m.CapacityShape.BAREMETAL:
            wholes = set(self.state.whole_lists(sku_name, region, tenant, Tier.ANY))
            return frozenset(
                (n.facts.region, n.facts.pool) for n in self.state.nodes if any(w in wholes for w in n.wholes)
            )
        parts = set(self.state.slice_lists(sku_name, region, tenant, Tier.ANY))
        return frozenset(
            (n.facts.region, n.facts.pool) for n in self.state.nodes if any(p in parts for p, _, _ in n.views)
        )

    @property
    def facts_version(self) -> int:
        """Bumped whenever a node's facts (and so its partitions and pool) change."""
        return self.state.facts_version

    def slice_parts(self, sku: str) -> list[SliceIndex]:
        """Every partition of one slice SKU (any region, any org)."""
        return [p for (s, _, _, _), p in self.state.slice_parts.items() if s == sku]

    def serving_layouts(self, sku: str) -> list[t.Layout]:
        """The layout of the slots each node sells to a slice SKU, in node order."""
        parts = self.slice_parts(sku)
        return [lay for node in self.state.nodes for part, _, lay in node.views if part in parts]

    def free_gpus(self, sku: str, region: str, tenant: str = "") -> int:
        return sum(p.free_gpus for p in self.state.slice_lists(sku, region, tenant, Tier.ANY))

    def mode_facts(self, name: str) -> modes.ModeFacts:
        """The facts `policies.modes` derives a node's mode from, as of now."""
        return nodestatus.mode_facts(self.state, name)

    def mode(self, name: str) -> modes.Mode:
        return nodestatus.mode(self.state, name)

    # ------------------------------------------------------------ placing

    def spec(self, sku_name: str, gpu_count: int, vm_profile: str | None = None) -> Spec | Refused:
        """The request shape checked against the SKUs, or why it is refused whatever the fleet holds."""
        return self._specs.get(sku_name, gpu_count, vm_profile)

    def place(self, req: Request, *, alternatives: int = 0, hold: Hold | None = None) -> Placed | Refused:
        """Choose and claim slots for one request; the claim stays until `release`.

        An allocation already held is answered with where it is. The nodes
        the request avoids are out of the indexes while it is picked (and
        explained, so a refusal counts only what the request could take).
        `hold` is asked when the pick would open an empty host a whole-host
        request could take (`reserving.Holding`). When it answers a refusal,
        that pool's empty hosts are out of the indexes too and the request is
        picked again: it may open another pool's empty host (asked again) or
        take a used host of a later tier; with nothing left, the first
        refusal is the answer and nothing is claimed.
        """
        spec = self._specs.get(req.sku, req.gpu_count, req.vm_profile)
        if isinstance(spec, Refused):
            return spec
        state = self.state
        if req.allocation_id in state.where:
            held = state.where[req.allocation_id]
            return Placed(held.name, held.slots(held.allocs[req.allocation_id]), spec.sku.capacity_shape, spec.profile)
        whole = spec.sku.capacity_shape is m.CapacityShape.BAREMETAL
        hidden = [n for name in sorted(req.avoid) if (n := state.by_name.get(name)) is not None]
        for n in hidden:
            state.unindex(n)
        try:
            found = self._picker.pick(req, spec.rule, whole, alternatives)
            if found is None:
                return self._explainer.explain(req)
            first: Refused | None = None
            while hold is not None and not found[0].allocs and found[0].whole_ok:
                pool = (found[0].facts.region, found[0].facts.pool)
                refused = hold(pool)
                if refused is None:
                    break
                first = first or refused
                kept = [
                    n
                    for n in state.nodes
                    if not n.allocs
                    and n.whole_ok
                    and (n.facts.region, n.facts.pool) == pool
                    and n.name not in req.avoid
                ]
                for n in kept:
                    state.unindex(n)
                hidden += kept
                found = self._picker.pick(req, spec.rule, whole, alternatives)
                if found is None:
                    return first
        finally:
            for n in hidden:
                state.index(n)
        node, mask, alts = found
        state.claim(
            node,
            req.allocation_id,
            mask,
            exclusive=whole,
            since=req.requested_at,
            end=packing.NO_END if req.ends_at is None else req.ends_at,
        )
        return Placed(node.name, node.slots(mask), spec.sku.capacity_shape, spec.profile, alts)

    def release(self, allocation_id: str) -> bool:
        """Free every slot the allocation holds (its cleanup is assumed done)."""
        return self.state.release(allocation_id)

    def explain(self, req: Request) -> Refused:
        """Why nothing can take this request now, most fundamental reason first."""
        return self._explainer.explain(req)

    # ------------------------------------------------------------ counting

    def launchable(
        self, sku_name: str, region: str, g: int, *, tenant: str = "", limit: int
    ) -> tuple[int, Refused | None]:
        """How many g-GPU requests of a slice SKU fit one after the other, and why the next one would not."""
        return self._counter.launchable(sku_name, region, g, tenant=tenant, limit=limit)

    def whole_launchable(
        self, sku_name: str, region: str, g: int, *, tenant: str = "", limit: int
    ) -> tuple[int, Refused | None]:
        """How many fresh whole-node requests of a baremetal SKU fit one after the other, and why the next not."""
        return self._counter.whole_launchable(sku_name, region, g, tenant=tenant, limit=limit)

    # ------------------------------------------------------------ warm upkeep

    def reset_node(
        self, name: str, claims: Iterable[plans.ExistingClaim], facts: fleetgraph.NodeFacts | None = None
    ) -> set[str]:
        """Make one node what a fresh engine builds from `facts` and `claims` (see `FleetState.reset_node`)."""
        return self.state.reset_node(name, claims, facts)

    def locate(self, allocation_id: str, nodes: Iterable[str]) -> None:
        """Where an allocation is held: the first known node of its observed claims."""
        self.state.locate(allocation_id, nodes)

    def retime(self, allocation_id: str, alloc: m.Allocation | None) -> bool:
        """Read an allocation's request time and lease end from its new document; True when either changed."""
        return self.state.retime(allocation_id, alloc)

    def recache(self, before: Mapping[str, frozenset[str]], after: Mapping[str, frozenset[str]]) -> None:
        """Move the warm-image sets from one observed image cache to the next."""
        self.state.recache(before, after)
