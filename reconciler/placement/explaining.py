"""Why nothing can take a request now: the refusal the planner and the capacity counts print.

Reasons that need no index (unknown region, no node of the SKU's GPU,
every node drained) come from `reasons.static_refusal` over node facts;
the rest read the partitions a request of any tier sees (`Tier.ANY`):
free GPUs, nodes with free slots, and slots their hosts report drifted.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from desired import models as m
from reconciler.placement import reasons
from reconciler.placement.fleetstate import FleetState
from reconciler.placement.requests import Refused, Request, Spec, Specs, Tier
from schemas import states

_MISSING: Any = object()


class Explainer:
    """Refusals for one fleet state; what they read off facts and drift is memoised until that changes."""

    def __init__(self, state: FleetState, specs: Specs) -> None:
        self.state = state
        self.specs = specs
        self._static: dict[tuple[str, str, str], Refused | None] = {}
        self._static_at = state.facts_version
        self._drifted: dict[tuple[str, str, str], int] = {}  # (sku, region, tenant) -> `drifted_slots`
        self._drifted_at = state.freed_version

    def explain(self, req: Request) -> Refused:
        """Why nothing can take this request now, most fundamental reason first."""
        spec = self.specs.get(req.sku, req.gpu_count, req.vm_profile)
        if isinstance(spec, Refused):
            return spec
        return self.refusal(req, spec)

    def refusal(self, req: Request, spec: Spec, counts: tuple[int, int, int] | None = None) -> Refused:
        """`explain` for a valid spec; `counts` (free GPUs, nodes with free, nodes) replace the partitions' own."""
        if self._static_at != self.state.facts_version:
            self._static.clear()
            self._static_at = self.state.facts_version
        key = (req.sku, req.region, req.tenant)
        static = self._static.get(key, _MISSING)
        if static is _MISSING:
            static = self._static[key] = reasons.static_refusal(self.state.facts, spec.sku, req.region, req.tenant)
        if static is not None:
            return static  # type: ignore[no-any-return]
        sku, g = spec.sku, req.gpu_count
        if sku.capacity_shape is m.CapacityShape.BAREMETAL:
            members = sum(p.members for p in self.state.whole_lists(req.sku, req.region, req.tenant, Tier.ANY))
            return Refused(
                reasons.NO_EMPTY_NODE,
                f"all {members} node(s) that lease {sku.sku} in {req.region} hold claims or wait "
                "for cleanup proof; a baremetal lease needs a node with no claim at all",
                MappingProxyType({"candidate_nodes": members}),
            )
        if counts is None:
            parts = self.state.slice_lists(req.sku, req.region, req.tenant, Tier.ANY)
            counts = (
                sum(p.free_gpus for p in parts),
                sum(p.nodes_with_free for p in parts),
                sum(len(p) for p in parts),
            )
        free, with_free, nodes = counts
        drifted = self.drifted_slots(sku, req.region, req.tenant)
        details = MappingProxyType(
            {
                "free_gpus": free,
                "nodes_with_free": with_free,
                "candidate_nodes": nodes,
                "gpu_count": g,
                "rule": spec.rule.value,
                "host_drift_slots": drifted,
            }
        )
        if drifted and free < g:
            return Refused(
                reasons.CAPACITY,
                f"only {free} free GPU(s) on {with_free} node(s) serve {sku.sku} in {req.region}; "
                f"{g} requested ({drifted} more slot(s) wait for their hosts to report them clear "
                "of drift)",
                details,
            )
        if free >= g:
            return Refused(
                reasons.TOPOLOGY,
                f"{free} free GPU(s) on {with_free} node(s) serve {sku.sku} in {req.region}, but no "
                f"node has a topology-safe set of {g} ({spec.rule.value})",
                details,
            )
        return Refused(
            reasons.CAPACITY,
            f"only {free} free GPU(s) on {with_free} node(s) serve {sku.sku} in {req.region}; {g} requested",
            details,
        )

    def drifted_slots(self, sku: m.Sku, region: str, tenant: str) -> int:
        """Unclaimed, otherwise sellable slots of the SKU's GPU in the region that their hosts report drifted.

        Placing never takes a drifted slot, so only a freed claim or new facts change the count.
        """
        if self._drifted_at != self.state.freed_version:
            self._drifted.clear()
            self._drifted_at = self.state.freed_version
        key = (sku.sku, region, tenant)
        found = self._drifted.get(key)
        if found is None:
            found = 0
            for node in self.state.nodes:
                f = node.facts
                if f.region != region or not f.host_blocked or not Tier.ANY.admits(f.org, tenant):
                    continue
                claimed = node.claimed
                found += sum(
                    1
                    for p, s in enumerate(f.slots)
                    if s.host_blocked
                    and not s.ineligible
                    and s.gpu_model == sku.accelerator_model
                    and s.status is states.SlotStatus.AVAILABLE
                    and not claimed >> p & 1
                )
            self._drifted[key] = found
        return found
