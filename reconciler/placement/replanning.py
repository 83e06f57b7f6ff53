"""Incremental planning for `gpuaas run`: one placement engine kept across revisions.

`planner.plan` builds a `placing.Engine` and its packing index for the whole
fleet, about a second at 10,000 nodes. A commit changes one allocation or one
node, so the watch loop keeps the engine of the last plan and brings it to
what a fresh engine would hold for the new revision, one node at a time.
The plan must equal `planner.plan(desired, observed)`; what makes it so:

- The engine's claims are a cache of the *observed* claims, which the
  reconciler re-reads from the database every revision. A node is reset to
  exactly its observed claims when they differ from those loaded last time,
  when this planner placed onto it in the last plan (applied or not: only
  the database says), when its facts changed (a new Node or SlotMap object
  from the blob cache, a drain, slot status, health, firmware), or when it
  holds an allocation whose request time or lease term changed (tie-break
  keys read them). Nothing this planner placed is ever believed.
- What shapes the whole index (the Fleet document: policy, workload mix,
  lease-end weight; the SKUs; the set of nodes, whose name order is every
  node's id and last tie-break) rebuilds the engine cold, as does any error
  in the incremental path, a change to most of the fleet, and every
  `FULL_EVERY` plans. Each cold build is logged with its reason.
- A desired state read by delta from the one the engine was brought to
  (the caller passes the Delta the reader returned beside the state,
  `desired.reading.deltas`) names its changed nodes and slot maps; with the
  observed slot statuses, firmware and health compared as sets, only those
  nodes' facts are built again, instead of every node's. The same holds
  the other way (a PR plan goes from head back to base, and only head
  was read by delta: `delta_back`), and for the very state the
  engine was brought to, when that state is immutable by contract: it
  was read by delta, or the engine reached it back from the state built from
  it (`_Kept.frozen`). Then no document changed, and only the observed
  facts and claims are compared. A state known neither way (a test may edit
  one in place and plan it again) has every node's facts compared.

Pure, like the planner: no I/O, no clock.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from desired import models as m
from desired.state import Delta, DesiredState, delta_back, delta_since
from reconciler import plans
from reconciler.placement import fleetgraph, placing, planner

log = logging.getLogger("gpuaas.planning")

FULL_EVERY = 500  # plans between cold rebuilds: bounds what a missed case could cost
STALE_MAX = 2  # without an idle moment to rebuild in (`rebuild_due`), a plan builds cold at this many times that
MOST_MIN = 32  # a sync resetting more than this and half the fleet builds cold instead


@dataclass(frozen=True, slots=True)
class _Kept:
    """The engine after the last plan, and the inputs it was brought to before planning.

    The inputs are copies, not the caller's dicts: a caller that edits its
    desired state in place must still show up as a change.
    """

    engine: placing.Engine
    fleet: m.Fleet | None
    skus: dict[str, m.Sku]
    allocations: dict[str, m.Allocation]
    image_cache: dict[str, frozenset[str]]
    by_node: dict[str, tuple[plans.ExistingClaim, ...]]  # observed claims per node, in claim_order
    by_alloc: dict[str, set[str]]  # allocation id -> nodes of its observed claims
    placed_on: frozenset[str]  # nodes the plan placed onto (engine state the database may not share)
    age: int  # plans since the engine was built cold
    desired: weakref.ref[DesiredState]  # the state itself, for a delta read from it
    observed: plans.Observed  # node facts' other inputs: slot statuses, firmware, health
    frozen: bool  # `desired` is never edited in place (see `_frozen`): planning it again changes no document
    delta: Delta | None  # how `desired` was read from the state before it, when it was (its reader's Delta)


# _Kept's fields `suspend` leaves out: both name states by weak reference.
_UNKEPT = ("desired", "delta")


class _Cold(Exception):
    """The incremental path declines; the message says why."""


class WarmPlanner:
    """A `reconciling.Planner` that keeps its engine between calls (`planner.plan`'s plans, faster)."""

    def __init__(self, policy: str | None = None, *, full_every: int = FULL_EVERY) -> None:
        self.policy = policy
        self.full_every = full_every
        self._kept: _Kept | None = None
        self.cold = 0  # cold builds so far
        self.last_cold = ""  # why the last one
        self.last_reset = 0  # nodes the last warm plan reset
        self.by_delta = 0  # warm syncs that built facts only for what a delta named (none: the same state)
        self.last_sync = ""  # how the last call found what changed: delta, reverse, same, full (or cold)
        self._rebuild = False  # the next plan builds the engine cold (`rebuild`)

    def __call__(self, desired: DesiredState, observed: plans.Observed, delta: Delta | None = None) -> plans.Plan:
        """`planner.plan(desired, observed)`. `delta`: how the reader built `desired` from an earlier state, if so."""
        kept, self._kept = self._kept, None  # a plan that raises leaves no half-updated engine behind
        why_cold = "first plan"
        if self._rebuild and kept is not None:
            kept, why_cold = None, f"periodic full rebuild, made while idle (every {self.full_every} plans)"
        self._rebuild = False
        frozen = _frozen(kept, desired, delta)
        by_node, by_alloc = _group(observed.claims)
        got = why_cold if kept is None else self._warm(kept, desired, observed, by_node, by_alloc, delta=delta)
        if isinstance(got, str):
            self.cold += 1
            self.last_cold, self.last_sync = got, "cold"
            log.info("placement engine built cold: %s", got)
            engine = placing.Engine(desired, observed, policy=self.policy)
            plan, age = planner.plan_with(engine, desired, observed), 0
        else:
            plan, engine = got
            age = kept.age + 1 if kept is not None else 0
        self._kept = _Kept(
            engine,
            desired.fleet,
            dict(desired.skus),
            dict(desired.allocations),
            dict(observed.image_cache),
            by_node,
            by_alloc,
            frozenset(p.node for p in plan.placements),
            age,
            weakref.ref(desired),
            observed,
            frozen,
            delta,
        )
        return plan

    def engine(self, desired: DesiredState, observed: plans.Observed, delta: Delta | None = None) -> placing.Engine:
        """An engine holding what `placing.Engine(desired, observed)` holds, brought from the kept one.

        For readers of the engine (PR plans: node modes, the capacity read
        model). It stays kept: the caller must leave it as it found it (probes
        placed are released), so the next call syncs from it.
        """
        kept, self._kept = self._kept, None
        frozen = _frozen(kept, desired, delta)
        by_node, by_alloc = _group(observed.claims)
        engine, age = None, 0
        if kept is not None:
            try:
                engine, age = self._sync(kept, desired, observed, by_node, by_alloc, read_by=delta), kept.age + 1
            except Exception as e:  # _Cold or any doubt: build it cold
                log.info("placement engine built cold: %s", e)
        if engine is None:
            self.cold += 1
            self.last_sync = "cold"
            engine = placing.Engine(desired, observed, policy=self.policy)
        self._kept = _Kept(
            engine,
            desired.fleet,
            dict(desired.skus),
            dict(desired.allocations),
            dict(observed.image_cache),
            by_node,
            by_alloc,
            frozenset(),
            age,
            weakref.ref(desired),
            observed,
            frozen,
            delta,
        )
        return engine

    def suspend(self) -> tuple[Any, ...] | None:
        """The kept engine and what it was brought to, as plain fields, for `resume` in another process.

        The state itself is left out (it is held by weak reference): the caller
        keeps it beside these and hands it back to `resume`; so is the Delta it
        was read by (it names an older state by weak reference too).
        """
        kept = self._kept
        if kept is None:
            return None
        return tuple(getattr(kept, name) for name in _Kept.__slots__ if name not in _UNKEPT)

    @classmethod
    def resume(cls, fields: tuple[Any, ...], desired: DesiredState, policy: str | None = None) -> WarmPlanner:
        """A planner whose kept engine is one `suspend` gave, brought to `desired` (the very state it was)."""
        names = [name for name in _Kept.__slots__ if name not in _UNKEPT]
        if len(fields) != len(names):
            raise ValueError(f"suspended planner has {len(fields)} fields, not {len(names)}")
        planner = cls(policy)
        planner._kept = _Kept(**dict(zip(names, fields, strict=True)), desired=weakref.ref(desired), delta=None)
        return planner

    def rebuild_due(self) -> bool:
        """`full_every` plans came from the kept engine: time for a cold build (the loop makes it while
        idle, `rebuild`; a plan builds cold anyway after full_every * STALE_MAX)."""
        return self._kept is not None and self._kept.age + 1 >= self.full_every

    def rebuild(self) -> None:
        """The next plan builds the engine cold (seconds at 10,000 nodes: never on a commit if avoidable)."""
        self._rebuild = True

    def _warm(
        self,
        kept: _Kept,
        desired: DesiredState,
        observed: plans.Observed,
        by_node: dict[str, tuple[plans.ExistingClaim, ...]],
        by_alloc: dict[str, set[str]],
        *,
        delta: Delta | None,
    ) -> tuple[plans.Plan, placing.Engine] | str:
        """The plan on the kept engine brought up to date, or why a cold engine must make it."""
        try:
            engine = self._sync(kept, desired, observed, by_node, by_alloc, read_by=delta)
        except _Cold as e:
            return str(e)
        except Exception as e:  # any doubt: a fresh engine gives the right plan
            why = f"incremental sync failed ({type(e).__name__}: {e})"
            log.warning("%s; building the placement engine cold", why)
            return why
        try:
            return planner.plan_with(engine, desired, observed), engine
        except Exception as e:
            why = f"planning on the kept engine failed ({type(e).__name__}: {e})"
            log.warning("%s; building the placement engine cold", why)
            return why

    def _sync(
        self,
        kept: _Kept,
        desired: DesiredState,
        observed: plans.Observed,
        by_node: dict[str, tuple[plans.ExistingClaim, ...]],
        by_alloc: dict[str, set[str]],
        *,
        read_by: Delta | None,
    ) -> placing.Engine:
        """The kept engine, reset node by node to what `placing.Engine(desired, observed)` holds."""
        self.last_sync, delta = _since(kept, desired, read_by)
        self._check_shape(kept, desired, delta)
        engine = kept.engine
        engine.warnings.clear()  # they describe what a sync loaded; a kept list would only grow
        self.by_delta += delta is not None
        refacts = (
            _refacts(engine, desired, observed)
            if delta is None
            else _refacts_by_delta(engine, desired, observed, kept.observed, delta)
        )
        reset = set(refacts) | kept.placed_on
        for name in by_node.keys() | kept.by_node.keys():
            if by_node.get(name) != kept.by_node.get(name):
                reset.add(name)
        for aid in self._retimed(
            engine, kept.allocations, desired.allocations, delta.names("Allocation") if delta is not None else None
        ):
            reset.update(by_alloc.get(aid, ()), kept.by_alloc.get(aid, ()))
        reset &= engine.by_name.keys()  # claims on undeclared nodes are ignored, as a fresh engine does
        if len(reset) > max(MOST_MIN, len(engine.nodes) // 2):  # resetting costs about what building costs
            raise _Cold(f"{len(reset)} of {len(engine.nodes)} nodes changed")
        touched: set[str] = set()
        for name in sorted(reset):
            touched |= engine.reset_node(name, by_node.get(name, ()), refacts.get(name))
        for aid in touched:
            engine.locate(aid, by_alloc.get(aid, ()))
        if observed.image_cache != kept.image_cache:
            engine.recache(kept.image_cache, observed.image_cache)
        self.last_reset = len(reset)
        return engine

    def _check_shape(self, kept: _Kept, desired: DesiredState, delta: Delta | None) -> None:
        """Raise `_Cold` when what shapes the whole index changed. `delta`: how `desired` differs from the
        state the engine was brought to (None: unknown); one that names no Node leaves the node names
        as they were, and their 100,000 keys are not compared per commit."""
        if kept.age + 1 >= self.full_every * STALE_MAX:
            raise _Cold(f"periodic full rebuild (every {self.full_every} plans, {kept.age + 1} without one)")
        if desired.fleet is not kept.fleet and desired.fleet != kept.fleet:
            raise _Cold("the Fleet document changed (policy, workload mix or lease weighting)")
        if desired.skus != kept.skus:
            raise _Cold("SKUs changed")
        if (delta is None or "Node" in delta.kinds()) and desired.nodes.keys() != kept.engine.by_name.keys():
            raise _Cold("nodes were added or removed (node order is the last tie-break)")

    @staticmethod
    def _retimed(
        engine: placing.Engine, old: dict[str, m.Allocation], new: dict[str, m.Allocation], changed: set[str] | None
    ) -> Iterable[str]:
        """Allocations whose request time or lease end changed (new documents only are read).

        `changed`: the allocations a delta names (None: compare them all)."""
        if changed is not None:
            return [
                aid for aid in sorted(changed) if old.get(aid) is not new.get(aid) and engine.retime(aid, new.get(aid))
            ]
        out = [aid for aid, alloc in new.items() if old.get(aid) is not alloc and engine.retime(aid, alloc)]
        out += [aid for aid in old.keys() - new.keys() if engine.retime(aid, None)]
        return out


def _since(kept: _Kept, desired: DesiredState, delta: Delta | None) -> tuple[str, Delta | None]:
    """How the documents of `desired` differ from those the engine was brought to, and the Delta naming them.

    "delta": desired was read by `delta` from that state; "reverse": that
    state was read by delta from desired (the same keys differ); "same": it
    is desired, and frozen, so nothing differs; "full" (no Delta): unknown.
    """
    was = kept.desired()
    if was is not None and was is desired:
        # Identity alone proves nothing: a caller may have edited the state in place since.
        return ("same", Delta(kept.desired, frozenset())) if kept.frozen else ("full", None)
    ahead = delta_since(delta, was)
    if ahead is not None:
        return "delta", ahead
    back = delta_back(kept.delta, desired, was)
    return ("full", None) if back is None else ("reverse", back)


def _frozen(kept: _Kept | None, desired: DesiredState, delta: Delta | None) -> bool:
    """Is `desired` immutable by contract (`desired.state.delta_back`), so planning it again changes no document?

    Yes when the reader built it by delta (`delta` given), when it is the
    base of the state the engine was brought to (the child shares its
    tables), or when it is that state and was frozen then. A state not read
    by delta, that nothing was read by delta from, may be edited in place.
    """
    if delta is not None:
        return True
    if kept is None:
        return False
    was = kept.desired()
    if was is desired:
        return kept.frozen
    return was is not None and kept.delta is not None and kept.delta.base() is desired


def _refacts(
    engine: placing.Engine, desired: DesiredState, observed: plans.Observed
) -> dict[str, fleetgraph.NodeFacts]:
    """Nodes whose facts are other than the engine's (every node looked at)."""
    refacts: dict[str, fleetgraph.NodeFacts] = {}
    for f, node in zip(fleetgraph.inventory(desired, observed), engine.nodes, strict=True):
        if f.name != node.name:
            raise _Cold(f"node order differs at {f.name}")
        if f is not node.facts:
            refacts[f.name] = f
    return refacts


def _refacts_by_delta(
    engine: placing.Engine, desired: DesiredState, observed: plans.Observed, before: plans.Observed, delta: Delta
) -> dict[str, fleetgraph.NodeFacts]:
    """New facts for the nodes whose inputs changed: documents the delta names, observed facts that differ."""
    names = delta.names("Node") | delta.names("SlotMap")
    names.update(node for node, _ in _differ(observed.slot_status, before.slot_status))
    names.update(_differ(observed.firmware_ready, before.firmware_ready))
    names.update(observed.unavailable_nodes ^ before.unavailable_nodes)
    names.update(node for node, _ in _differ(observed.slot_blocks, before.slot_blocks))
    names.update(_differ(observed.corrupt_nodes, before.corrupt_nodes))
    out: dict[str, fleetgraph.NodeFacts] = {}
    for name in names:
        node = desired.nodes.get(name)
        if node is None or name not in engine.by_name:
            continue  # not declared: no facts, as a fresh engine has none
        out[name] = fleetgraph.node_facts(
            node,
            desired.slot_maps.get(name),
            slot_status=observed.slot_status,
            firmware_ready=observed.firmware_ready.get(name, node.firmware_ready),
            healthy=name not in observed.unavailable_nodes,
            host_blocks=observed.slot_blocks,
            corrupt=observed.corrupt_nodes.get(name, ()),
        )
    return out


def _differ(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> set[Any]:
    """Keys whose value differs, or that only one side has."""
    return {k for k, _ in a.items() ^ b.items()}


def _group(
    claims: Iterable[plans.ExistingClaim],
) -> tuple[dict[str, tuple[plans.ExistingClaim, ...]], dict[str, set[str]]]:
    """Observed claims per node (in the order a fresh engine loads them) and nodes per allocation."""
    by_node: dict[str, list[plans.ExistingClaim]] = {}
    by_alloc: dict[str, set[str]] = {}
    for c in sorted(claims, key=placing.claim_order):
        by_node.setdefault(c.node, []).append(c)
        by_alloc.setdefault(c.allocation_id, set()).add(c.node)
    return {n: tuple(cs) for n, cs in by_node.items()}, by_alloc
