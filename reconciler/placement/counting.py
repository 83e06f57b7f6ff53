"""How many requests of one shape fit one after the other, and why the next would not.

`capacity.fill` asks this for every region x SKU x size: the answer placing
probes until one is refused would give, computed without moving a node.
"""

from __future__ import annotations

from desired import models as m
from policies import packing
from policies import topology as t
from reconciler.placement.explaining import Explainer
from reconciler.placement.fleetstate import FleetState
from reconciler.placement.requests import Refused, Request, Specs, Tier


class FitCounter:
    """Launchable counts over one fleet state; per-pattern fills memoised (patterns repeat fleet-wide)."""

    def __init__(self, state: FleetState, specs: Specs, explainer: Explainer) -> None:
        self.state = state
        self.specs = specs
        self.explainer = explainer
        # (layout, free mask, g, rule, mix) -> what `_fill_node` found
        self._fills: dict[tuple[int, int, int, m.TopologyRule, int], tuple[int, int]] = {}

    def launchable(
        self, sku_name: str, region: str, g: int, *, tenant: str = "", limit: int
    ) -> tuple[int, Refused | None]:
        """How many g-GPU requests of a slice SKU fit one after the other, and why the next one would not.

        A slice request changes only the node it lands on, and on a node
        placing always takes the policy's in-node choice of its free mask, so
        each node's share is its own choice sequence, memoised per free
        pattern: no probe is placed. The refusal is `Explainer.refusal` of
        the state those probes would leave.
        """
        spec = self.specs.get(sku_name, g)
        if isinstance(spec, Refused):
            return 0, spec
        if spec.sku.capacity_shape is m.CapacityShape.BAREMETAL:
            raise ValueError(f"{sku_name} is leased whole: count empty nodes instead")
        total = free = with_free = nodes = 0
        for part in self.state.slice_lists(sku_name, region, tenant, Tier.ANY):
            nodes += len(part)
            for _, (lid, mask), _ in part.place.values():
                n, rest = self._fill_node(lid, mask, g, spec.rule, part.mix_id)
                total += n
                left = rest.bit_count()
                free += left
                with_free += left > 0
        if total >= limit:
            return limit, None
        return total, self.explainer.refusal(Request("", tenant, sku_name, g, region), spec, (free, with_free, nodes))

    def whole_launchable(
        self, sku_name: str, region: str, g: int, *, tenant: str = "", limit: int
    ) -> tuple[int, Refused | None]:
        """How many fresh whole-node requests of a baremetal SKU fit one after the other, and why the next not.

        The answer of placing probes (new allocation ids, no `avoid`) until one
        is refused, without moving a node. A whole-node request takes the head
        of an empty-node heap of its (SKU, region, org) partitions, own tier
        then shared; those tiers together are exactly the partitions `Tier.ANY`
        admits, a node sits in at most one whole partition, and a claim only
        takes a node out of the heaps (nothing comes back while probes are
        held): so each probe removes one node, and the probes stop when every
        admitted heap is empty. The refusal then is the explanation, which for
        a baremetal SKU reads only facts and partition sizes, never claims.
        """
        if limit <= 0:
            return 0, None  # probing stops before the first request
        spec = self.specs.get(sku_name, g)
        if isinstance(spec, Refused):
            return 0, spec
        if spec.sku.capacity_shape is not m.CapacityShape.BAREMETAL:
            raise ValueError(f"{sku_name} is sold in slices: use launchable")
        empty = sum(len(p.empty) for p in self.state.whole_lists(sku_name, region, tenant, Tier.ANY))
        if empty >= limit:
            return limit, None
        return empty, self.explainer.refusal(Request("", tenant, sku_name, g, region), spec)

    def _fill_node(self, lid: int, mask: int, g: int, rule: m.TopologyRule, mix_id: int) -> tuple[int, int]:
        """(requests of g GPUs the free `mask` takes one after the other, the mask left), memoised."""
        key = (lid, mask, g, rule, mix_id)
        found = self._fills.get(key)
        if found is None:
            lay = self.state.layouts[lid]
            policy, mix = self.state.policy, self.state.mixes[mix_id]
            n, rest = 0, mask
            while True:
                c = packing.in_node(policy, lay, rest, t.choices(lay, rest, g, rule), mix)
                if c is None:
                    break
                n, rest = n + 1, rest & ~c.mask
            found = self._fills[key] = (n, rest)
        return found
