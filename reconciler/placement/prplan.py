"""A pull request's plan: what merging head would do, composed from the pure parts.

`compose(base, head, observed)` runs, with no I/O:

- `inventory_diff.diff(base, head)`: inventory added, changed or removed,
  slots becoming (un)schedulable with their eligibility reasons, capability
  changes;
- `planner.plan(head, observed)`: placements (node, slots, VM profile),
  pending allocations (code and sentence) and releases;
- `planner.plan(base, observed)`: what would happen without the PR, so a
  pending allocation that was already pending for the same reason is not
  counted as a change;
- node modes before (base) and after (head with its plan applied), so a node
  set to draining, or a node taking its first slice, shows up;
- `capacity.read_model` before and after: launchable counts per region x SKU
  x GPU count.

`offline_observed(base)` is the state implied by base alone, for CI without
a database: base planned from empty claims, its placements taken as claims.

A PrPlan with validation errors in head plans nothing (`errors` set, the rest
empty); the command exits 1. So does one that edits an allocation holding
claims in `observed` (`policies.immutables`, head against base).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Protocol

from desired import problems as p
from desired.state import Delta, DesiredState, delta_since
from policies import immutables
from reconciler import plans
from reconciler.placement import capacity, inventory_diff, placing, planner
from schemas import states


@dataclass(frozen=True, slots=True)
class NodeChange:
    """A node whose capability or derived mode changes."""

    node: str
    capability_before: str | None
    capability_after: str | None
    mode_before: str | None
    mode_after: str | None
    why: tuple[str, ...] = ()  # capability reason codes after the change


@dataclass(frozen=True, slots=True)
class Affected:
    """A running allocation on a node this change drains, re-modes or whose slots it changes."""

    allocation_id: str
    tenant: str
    node: str
    slot_indexes: tuple[int, ...]
    change: str  # what happens to its node, in words (`admin_state: active -> draining`)


@dataclass(frozen=True, slots=True)
class SkuCapacity:
    """Units of one product in one region before and after: total declared and usable (free, launchable)."""

    region: str
    sku: str
    unit: str
    total_before: int
    total_after: int
    usable_before: int
    usable_after: int


@dataclass(frozen=True, slots=True)
class CapacityChange:
    region: str
    sku: str
    gpu_count: int
    before: int
    after: int


@dataclass(frozen=True, slots=True)
class PrPlan:
    base_revision: str | None
    head_revision: str | None
    offline: bool
    errors: tuple[p.Problem, ...] = ()  # head validation errors: nothing is planned
    base_errors: tuple[p.Problem, ...] = ()  # base was invalid: its state is partial
    inventory: inventory_diff.InventoryDiff = field(default_factory=inventory_diff.InventoryDiff)
    nodes: tuple[NodeChange, ...] = ()
    plan: plans.Plan = field(default_factory=plans.Plan)
    base_pending: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # id -> code
    capacity_before: capacity.ReadModel = field(default_factory=capacity.ReadModel)
    capacity_after: capacity.ReadModel = field(default_factory=capacity.ReadModel)
    # Allocations holding claims that head no longer declares at all: nothing releases them
    # (only `state: released` does), so a reviewer should see them.
    orphaned: tuple[str, ...] = ()
    affected: tuple[Affected, ...] = ()  # running allocations on the nodes this change touches
    tenants: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # allocation -> tenant
    # What the hosts report that keeps capacity off the market (policies.hostreports), from `observed`:
    # (node, slot, codes); slot None for a node its host reports corrupt.
    host_blocked: tuple[tuple[str, int | None, tuple[str, ...]], ...] = ()

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def new_pending(self) -> tuple[plans.Pending, ...]:
        """Pending allocations that are new, or pending for another reason than without the PR."""
        return tuple(x for x in self.plan.pending if self.base_pending.get(x.allocation_id) != x.code)

    @property
    def capacity_changes(self) -> tuple[CapacityChange, ...]:
        before, after = self.capacity_before.launchable(), self.capacity_after.launchable()
        return tuple(
            CapacityChange(r, s, g, before.get((r, s, g), 0), after.get((r, s, g), 0))
            for r, s, g in sorted(set(before) | set(after))
            if before.get((r, s, g), 0) != after.get((r, s, g), 0)
        )

    @property
    def sku_capacity(self) -> tuple[SkuCapacity, ...]:
        """Per region x SKU, total and usable units before -> after, where either moves."""
        before = {(o.region, o.sku): o for o in self.capacity_before.offers}
        after = {(o.region, o.sku): o for o in self.capacity_after.offers}
        out = []
        for key in sorted(set(before) | set(after)):
            b, a = before.get(key), after.get(key)
            either = a or b
            row = SkuCapacity(
                key[0],
                key[1],
                either.unit if either is not None else "slot",
                b.total if b else 0,
                a.total if a else 0,
                b.usable if b else 0,
                a.usable if a else 0,
            )
            if (row.total_before, row.usable_before) != (row.total_after, row.usable_after):
                out.append(row)
        return tuple(out)

    @property
    def changed(self) -> bool:
        """Would merging change anything? (terraform -detailed-exitcode: 2)"""
        return bool(
            self.inventory.changes
            or self.inventory.slots
            or self.nodes
            or self.plan.placements
            or self.plan.releases
            or self.new_pending
        )


Planner = plans.Planner


class EngineMaker(Protocol):
    """Makes an engine as `placing.Engine(desired, observed)` does; `delta` as `plans.Planner` takes it."""

    def __call__(
        self, desired: DesiredState, observed: plans.Observed, delta: Delta | None = None, /
    ) -> placing.Engine: ...


def _cold_planner(policy: str | None) -> Planner:
    def plan(desired: DesiredState, observed: plans.Observed, delta: Delta | None = None, /) -> plans.Plan:
        return planner.plan(desired, observed, policy=policy)

    return plan


def _cold_engine(policy: str | None) -> EngineMaker:
    def make(desired: DesiredState, observed: plans.Observed, delta: Delta | None = None, /) -> placing.Engine:
        return placing.Engine(desired, observed, policy=policy)

    return make


def offline_observed(
    base: DesiredState, *, policy: str | None = None, plan_with: Planner | None = None
) -> plans.Observed:
    """The claims base implies on its own: plan it from no claims, keep what it placed."""
    plan_with = plan_with or _cold_planner(policy)
    return after(plans.Observed(), plan_with(base, plans.Observed()))


def after(observed: plans.Observed, plan: plans.Plan) -> plans.Observed:
    """Observed as it will be once `plan` is applied: placements claimed, releases in cleanup."""
    releasing = {r.allocation_id for r in plan.releases}
    claims = [
        replace(c, status=states.ClaimStatus.RELEASING) if c.allocation_id in releasing else c for c in observed.claims
    ]
    slot_status = dict(observed.slot_status)
    for r in plan.releases:
        for idx in r.slot_indexes:
            slot_status[(r.node, idx)] = states.SlotStatus.CLEANUP
    for pl in plan.placements:
        if pl.claim_kind is states.ClaimKind.NODE_EXCLUSIVE:
            claims.append(
                plans.ExistingClaim(
                    pl.allocation_id, pl.node, pl.claim_kind, None, states.ClaimStatus.RESERVED, pl.tenant
                )
            )
        else:
            claims.extend(
                plans.ExistingClaim(
                    pl.allocation_id, pl.node, pl.claim_kind, idx, states.ClaimStatus.RESERVED, pl.tenant
                )
                for idx in pl.slot_indexes
            )
    return replace(
        observed,
        claims=tuple(claims),
        slot_status=MappingProxyType(slot_status),
        placed=observed.placed | {pl.allocation_id for pl in plan.placements},
    )


def held_ids(observed: plans.Observed) -> set[str]:
    """Allocations that hold live claims in `observed` (a failed attempt's retired claims are labelled apart)."""
    return {c.allocation_id for c in observed.claims}


def invalid(
    base_revision: str | None, head_revision: str | None, errors: tuple[p.Problem, ...], *, offline: bool
) -> PrPlan:
    return PrPlan(base_revision, head_revision, offline, errors=errors)


@dataclass(frozen=True, slots=True)
class BaseSide:
    """What a PR plan reads of base alone, against given claims: kept with a base (`caches.keptworlds`).

    `memo` holds base's per-node capacity parts (head's read model reuses
    them for nodes the PR leaves alone); `modes` is (capability, mode) of
    every node, or of the nodes this run's delta names when the side is not kept.
    """

    pending: Mapping[str, str]  # base's pending allocations: id -> code
    offers: capacity.ReadModel
    memo: capacity.Memo
    schedulable: Mapping[str, inventory_diff.Slots]
    modes: Mapping[str, tuple[str, str]]


def compose(
    base: DesiredState,
    head: DesiredState,
    observed: plans.Observed,
    *,
    offline: bool,
    base_errors: tuple[p.Problem, ...] = (),
    policy: str | None = None,
    plan_with: Planner | None = None,
    engine_for: EngineMaker | None = None,
    side: BaseSide | None = None,
    keep: Callable[[BaseSide], None] | None = None,
    delta: Delta | None = None,
) -> PrPlan:
    """Everything merging head would do, given the claims in `observed`.

    `plan_with` plans a (state, claims) pair as `planner.plan` does, and
    `engine_for` makes an engine as `placing.Engine(state, claims)` does; the
    CLI passes one `replanning.WarmPlanner` for both, so base and head share
    one engine (they differ in a few documents). An engine from `engine_for`
    is read, and left as found, before the next one is asked for.

    `side`: base's own part, kept from an earlier run against the same
    claims (nothing of base is planned or read again). Without it, it is
    computed, and `keep`, if given, is called with it (every node's mode
    read) while `engine_for`'s engine still holds base: the CLI keeps both.

    `delta`: how the reader built head from base, when it read head by delta.
    """
    edits = immutables.check(head, immutables.held_from(base, held_ids(observed)))
    if edits:  # an edit of an allocation that holds claims: refused like a validation error
        return invalid(base.revision, head.revision, tuple(edits), offline=offline)
    plan_with = plan_with or _cold_planner(policy)
    engine_for = engine_for or _cold_engine(policy)
    head_plan = plan_with(head, observed, delta)
    observed_after = after(observed, head_plan)
    only = _mode_candidates(base, head, observed, observed_after, delta)
    if side is None:
        side = _base_side(
            base,
            observed,
            policy=policy,
            plan_with=plan_with,
            engine_for=engine_for,
            only=None if keep is not None else only,
        )
        if keep is not None:
            keep(side)
    modes_before = dict(side.modes) if only is None else {n: side.modes[n] for n in sorted(only) if n in side.modes}
    diff = inventory_diff.diff(
        base, head, firmware=observed.firmware_ready, schedulable_before=side.schedulable, delta=delta
    )
    now = engine_for(head, observed_after, delta)
    modes_after = _modes(now, only)
    # Offers only: a PR plan compares launchable counts (`capacity_changes`) and lists no node summaries.
    capacity_after = capacity.read_model(
        head, observed_after, policy=policy, engine=now, memo=side.memo, summaries=False
    )
    nodes = _node_changes(modes_before, modes_after, diff=diff)
    return PrPlan(
        base_revision=base.revision,
        head_revision=head.revision,
        offline=offline,
        base_errors=base_errors,
        inventory=diff,
        nodes=nodes,
        plan=head_plan,
        base_pending=side.pending,
        capacity_before=side.offers,
        capacity_after=capacity_after,
        orphaned=tuple(sorted({allocation_of(c.allocation_id) for c in observed.claims} - set(head.allocations))),
        affected=_affected(observed, diff, nodes),
        host_blocked=host_blocked(observed),
        tenants=MappingProxyType(
            {
                **{allocation_of(c.allocation_id): c.tenant for c in observed.claims if c.tenant},
                **{a: x.tenant for a, x in head.allocations.items()},
            }
        ),
    )


def allocation_of(label: str) -> str:
    """The allocation a claim belongs to: a failed attempt's claims, still releasing, are labelled
    `ID@attempt-N` for the planner (reconciler.store.lifecycle.retired_label); ids never hold `@`."""
    return label.partition("@")[0]


_LIVE = (states.ClaimStatus.RESERVED, states.ClaimStatus.PROVISIONING, states.ClaimStatus.ACTIVE)


def _affected(
    observed: plans.Observed, diff: inventory_diff.InventoryDiff, nodes: tuple[NodeChange, ...]
) -> tuple[Affected, ...]:
    """Running allocations on nodes whose Node or SlotMap, mode or slot eligibility this change moves."""
    why: dict[str, list[str]] = {}
    for c in diff.changes:
        if c.kind in ("Node", "SlotMap"):
            why.setdefault(c.name, []).append(f"{c.kind} {c.action}" + (f": {c.rendered_values()}" if c.fields else ""))
    for n in nodes:
        if n.mode_before != n.mode_after:
            why.setdefault(n.node, []).append(f"mode {n.mode_before} -> {n.mode_after}")
    for sc in diff.slots:
        if sc.schedulable_before and not sc.schedulable_after:
            why.setdefault(sc.node, []).append(f"slot {sc.slot_index} stops being schedulable")
    held: dict[tuple[str, str], list[int]] = {}
    tenant: dict[str, str] = {}
    for cl in observed.claims:
        if cl.node in why and cl.status in _LIVE and "@" not in cl.allocation_id:
            held.setdefault((cl.allocation_id, cl.node), [])
            if cl.slot_index is not None:
                held[(cl.allocation_id, cl.node)].append(cl.slot_index)
            tenant[cl.allocation_id] = cl.tenant
    return tuple(
        Affected(a, tenant[a], node, tuple(sorted(idx)), "; ".join(dict.fromkeys(why[node])))
        for (a, node), idx in sorted(held.items())
    )


def host_blocked(observed: plans.Observed) -> tuple[tuple[str, int | None, tuple[str, ...]], ...]:
    """Corrupt nodes and drifted slots as their hosts report them, in (node, slot) order; a node's own first."""
    found: list[tuple[str, int | None, tuple[str, ...]]] = [(n, None, c) for n, c in observed.corrupt_nodes.items()]
    found += [(n, i, c) for (n, i), c in observed.slot_blocks.items()]
    return tuple(sorted(found, key=lambda x: (x[0], -1 if x[1] is None else x[1])))


def _base_side(
    base: DesiredState,
    observed: plans.Observed,
    *,
    policy: str | None,
    plan_with: Planner,
    engine_for: EngineMaker,
    only: set[str] | None,
) -> BaseSide:
    """Base planned and read against `observed`; modes of `only` (None: every node)."""
    base_plan = plan_with(base, observed)
    before = engine_for(base, observed)
    memo = capacity.Memo()  # head's read model reuses base's per-node parts for nodes the PR leaves alone
    return BaseSide(
        pending=MappingProxyType({x.allocation_id: x.code for x in base_plan.pending}),
        offers=capacity.read_model(base, observed, policy=policy, engine=before, memo=memo, summaries=False),
        memo=memo,
        schedulable=inventory_diff.schedulable(base),
        modes=_modes(before, only),
    )


def _mode_candidates(
    base: DesiredState,
    head: DesiredState,
    observed: plans.Observed,
    observed_after: plans.Observed,
    delta: Delta | None,
) -> set[str] | None:
    """The only nodes whose capability or mode can differ, when head was read by delta from base.

    A node's mode is read from its own facts (its Node, its SlotMap, observed
    slot statuses, firmware and health) and its own claims; the two engines
    differ by the documents the delta names and by the claims and slot
    statuses head's plan changes. None (look at every node) without a delta,
    or when the delta touches a document every node may read.
    """
    delta = delta_since(delta, base)
    if delta is None or not delta.kinds() <= {"Node", "SlotMap", "Allocation"}:
        return None
    statuses = observed.slot_status.items() ^ observed_after.slot_status.items()
    return (
        delta.names("Node")
        | delta.names("SlotMap")
        | {node for (node, _), _ in statuses}
        | {c.node for c in set(observed.claims) ^ set(observed_after.claims)}
    )


def _modes(engine: placing.Engine, only: set[str] | None = None) -> dict[str, tuple[str, str]]:
    """Capability and mode per node (of `only`, when given)."""
    facts = engine.facts if only is None else [engine.by_name[n].facts for n in sorted(only & engine.by_name.keys())]
    return {f.name: (f.capability.capability.value, engine.mode(f.name).value) for f in facts}


def _node_changes(
    before: Mapping[str, tuple[str, str]], now: Mapping[str, tuple[str, str]], *, diff: inventory_diff.InventoryDiff
) -> tuple[NodeChange, ...]:
    why = {c.node: c.why for c in diff.capabilities}
    out = []
    for name in sorted(set(before) | set(now)):
        cap_b, mode_b = before.get(name, (None, None))
        cap_a, mode_a = now.get(name, (None, None))
        if (cap_b, mode_b) != (cap_a, mode_a):
            out.append(NodeChange(name, cap_b, cap_a, mode_b, mode_a, why.get(name, ())))
    return tuple(out)
