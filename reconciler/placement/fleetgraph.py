"""The fleet's topology: region -> pool -> node -> slot group -> PCIe pair -> slot.

`inventory()` folds desired state and observed facts (firmware readiness,
slot health and cleanup state, node health, live claims) into one plain
record per node: the only input the packing index is built from. `graph()`
turns the same records into a networkx tree with the device identities on
the slot vertices, for explanations and for operators; the planner never
walks it per request (it keeps bucketed indexes instead, see
`reconciler.placement.index`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from desired import models as m
from desired.state import DesiredState
from policies import capability, eligibility
from reconciler import plans
from schemas import states

if TYPE_CHECKING:
    import networkx as nx


class SlotFacts(NamedTuple):
    """One approved slot with its device identities and schedulability.

    A named tuple, not a frozen dataclass: a 10,000-node engine makes 80,000
    of them, and a frozen dataclass sets each field through object.__setattr__,
    several times slower to build. It holds no model: a PR plan's kept base
    (`reconciler.caches.keptworlds`) loads every node's slot facts, and its
    slot maps only when a change reads them.
    """

    index: int  # type: ignore[assignment]  # shadows tuple.index, which nothing calls on a slot
    group: str
    pair: str | None
    numa_node: int
    gpu_model: str
    gpu_pci_address: str
    fabric: m.Fabric
    fabric_vf_pci_address: str | None
    nvme_device: str
    mac_address: str
    pinned_sku: str | None
    ineligible: tuple[str, ...]  # eligibility reason codes; empty = eligible
    status: states.SlotStatus  # observed state other than claims (available if none)
    sellable: bool  # eligible, not waiting for cleanup, failed or disabled, and not blocked by its host
    host_blocked: tuple[str, ...] = ()  # the host reports it drifted or unschedulable (policies.hostreports)


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """One node as the planner sees it."""

    name: str
    region: str
    pool: str
    org: str | None
    admin_state: m.AdminState
    healthy: bool
    firmware_ready: bool
    storage_mode: m.StorageMode
    baremetal_sku: str | None
    capability: capability.CapabilityVerdict
    slots: tuple[SlotFacts, ...]  # slot_index order
    node: m.Node
    cleanup_pending: int  # slots without cleanup proof (cleanup, cleanup_blocked)
    corrupt: tuple[str, ...] = ()  # host evidence of node-wide corruption: the node takes nothing new
    host_blocked: int = 0  # slots its host reports drifted (a whole-node lease would reuse them)

    @property
    def active(self) -> bool:
        return self.healthy and not self.corrupt and self.admin_state is m.AdminState.ACTIVE

    @property
    def slice_capable(self) -> bool:
        return self.capability.slice_capable


_NONE: Mapping[Any, tuple[str, ...]] = {}


def node_facts(
    node: m.Node,
    slot_map: m.SlotMap | None,
    *,
    slot_status: Mapping[plans.SlotKey, states.SlotStatus],
    firmware_ready: bool,
    healthy: bool,
    host_blocks: Mapping[plans.SlotKey, tuple[str, ...]] = _NONE,
    corrupt: tuple[str, ...] = (),
) -> NodeFacts:
    slots: list[SlotFacts] = []
    cleanup = blocked = 0
    if slot_map is not None:
        reasons = eligibility.eligible_slots(slot_map)
        for s in sorted(slot_map.slots, key=lambda s: s.slot_index):
            status = slot_status.get((node.name, s.slot_index), states.SlotStatus.AVAILABLE)
            why = tuple(r.code for r in reasons[s.slot_index])
            host = host_blocks.get((node.name, s.slot_index), ()) if host_blocks else ()
            slots.append(
                SlotFacts(
                    s.slot_index,
                    s.slot_group,
                    s.pcie_pair,
                    s.numa_node,
                    s.gpu_model,
                    s.gpu_pci_address,
                    s.network_fabric,
                    s.fabric_vf_pci_address,
                    s.nvme_device,
                    s.mac_address,
                    s.capacity_metadata.sku,
                    why,
                    status,
                    # any reported state but available (cleanup, failed, disabled, or a claim
                    # state the claims did not show) keeps the slot off the market, and so does
                    # drift its host reports on it (seed 000: drift blocks reuse of the slot)
                    sellable=not why and status is states.SlotStatus.AVAILABLE and not host,
                    host_blocked=host,
                )
            )
            if status is states.SlotStatus.CLEANUP or status is states.SlotStatus.CLEANUP_BLOCKED:
                cleanup += 1
            blocked += bool(host)
    eligible = sum(1 for s in slots if not s.ineligible)
    verdict = capability.node_capability(node, firmware_ready=firmware_ready, eligible_slots=eligible)
    return NodeFacts(
        node.name,
        node.region,
        node.pool,
        node.org,
        node.admin_state,
        healthy,
        firmware_ready,
        node.storage_mode,
        node.baremetal_sku,
        verdict,
        tuple(slots),
        node,
        cleanup,
        corrupt,
        blocked,
    )


# The facts of the last inventory() per node, reused when the node's documents are the same
# objects (the watch loop's blob cache) and its observed inputs are equal: a revision that
# changes one node rebuilds one node's facts. Replaced whole by each call (no growth).
_FACTS: dict[str, tuple[tuple[Any, ...], NodeFacts]] = {}


def inventory(desired: DesiredState, observed: plans.Observed) -> tuple[NodeFacts, ...]:
    """Every declared node, in name order, with observed facts folded in."""
    global _FACTS  # noqa: PLW0603 - a memo, replaced whole per call
    out = []
    used: dict[str, tuple[tuple[Any, ...], NodeFacts]] = {}
    for name in sorted(desired.nodes):
        node = desired.nodes[name]
        smap = desired.slot_maps.get(name)
        ready = observed.firmware_ready.get(name, node.firmware_ready)
        healthy = name not in observed.unavailable_nodes
        statuses = tuple(observed.slot_status.get((name, s.slot_index)) for s in smap.slots) if smap else ()
        blocks = (
            tuple(observed.slot_blocks.get((name, s.slot_index)) for s in smap.slots)
            if smap and observed.slot_blocks
            else ()
        )
        corrupt = observed.corrupt_nodes.get(name, ())
        key = (node, smap, ready, healthy, statuses, blocks, corrupt)
        hit = _FACTS.get(name)
        if hit is not None and hit[0][0] is node and hit[0][1] is smap and hit[0][2:] == key[2:]:
            facts = hit[1]
        else:
            facts = node_facts(
                node,
                smap,
                slot_status=observed.slot_status,
                firmware_ready=ready,
                healthy=healthy,
                host_blocks=observed.slot_blocks,
                corrupt=corrupt,
            )
        used[name] = (key, facts)
        out.append(facts)
    _FACTS = used
    return tuple(out)


Vertex = tuple[str, ...]


def graph(nodes: Iterable[NodeFacts], claims: Iterable[plans.ExistingClaim] = ()) -> nx.DiGraph[Vertex]:
    """The topology tree; live claims are set on the slots (and nodes) they hold.

    Vertex ids are string tuples: ("region", r), ("pool", r, p), ("node", n),
    ("group", n, g), ("pair", n, g, pair), ("slot", n, str(index)). Every
    vertex has a `kind`; slots carry `index` as an int.
    """
    import networkx as nx  # only the inspection graph needs it: planning and the CLI stay light

    g: nx.DiGraph[Vertex] = nx.DiGraph()
    for n in nodes:
        region: Vertex = ("region", n.region)
        pool: Vertex = ("pool", n.region, n.pool)
        node: Vertex = ("node", n.name)
        g.add_node(region, kind="region", name=n.region)
        g.add_node(pool, kind="pool", name=n.pool)
        g.add_edge(region, pool)
        g.add_node(
            node,
            kind="node",
            name=n.name,
            org=n.org,
            admin_state=n.admin_state.value,
            healthy=n.healthy,
            capability=n.capability.capability.value,
            baremetal_sku=n.baremetal_sku,
            claim=None,
        )
        g.add_edge(pool, node)
        for s in n.slots:
            group: Vertex = ("group", n.name, s.group)
            if group not in g:
                g.add_node(group, kind="group", name=s.group, numa_node=s.numa_node)
                g.add_edge(node, group)
            parent = group
            if s.pair is not None:
                parent = ("pair", n.name, s.group, s.pair)
                if parent not in g:
                    g.add_node(parent, kind="pair", name=s.pair)
                    g.add_edge(group, parent)
            vertex: Vertex = ("slot", n.name, str(s.index))
            g.add_node(
                vertex,
                kind="slot",
                index=s.index,
                gpu_model=s.gpu_model,
                gpu_pci_address=s.gpu_pci_address,
                fabric=s.fabric.value,
                fabric_vf_pci_address=s.fabric_vf_pci_address,
                nvme_device=s.nvme_device,
                mac_address=s.mac_address,
                status=s.status.value,
                ineligible=s.ineligible,
                sellable=s.sellable,
                claim=None,
            )
            g.add_edge(parent, vertex)
    for c in claims:
        if c.kind is states.ClaimKind.NODE_EXCLUSIVE:
            if ("node", c.node) in g:
                g.nodes["node", c.node]["claim"] = c.allocation_id
        elif ("slot", c.node, str(c.slot_index)) in g:
            g.nodes["slot", c.node, str(c.slot_index)]["claim"] = c.allocation_id
    return g


def free_slots(g: nx.DiGraph[Vertex], node: str) -> list[int]:
    """Sellable, unclaimed slot indexes of one node, read off the graph."""
    if g.nodes["node", node].get("claim"):
        return []
    out = []
    import networkx as nx

    for v in nx.descendants(g, ("node", node)):
        d = g.nodes[v]
        if d["kind"] == "slot" and d["sellable"] and d["claim"] is None:
            out.append(d["index"])
    return sorted(out)
