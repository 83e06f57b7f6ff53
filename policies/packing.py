"""Packing scores: which node, and which slots on it, a slice should take.

Every policy ranks the same facts about one candidate placement (`Option`)
and picks the slots inside a node (`in_node`). Lower keys are better.

Baselines, selectable by name for comparison:

- `first-fit`: lowest node, lowest slots;
- `k8s-least-allocated` / `k8s-most-allocated`: Kubernetes NodeResourcesFit
  scores, `(capacity - requested) * 100 / capacity` and
  `requested * 100 / capacity` after the pod, ties to the lowest node;
- `seed-rank`: seed 002's ranking, single-NUMA fit, then fewest remaining
  slots, then fewest NUMA groups, then slot index, then node.

`default` follows the fragmentation-gradient idea (FGD, "Beware of
Fragmentation", USENIX ATC'23): a node's fragmentation is the expected number
of its free GPUs that a request drawn from the workload mix could not use
(`stranded`), and a placement should raise that expectation as little as
possible. On top of that gradient it keeps two rules of seed 000: a slice
never opens a clean node while a node already in slice use can take it, and
the NUMA-aligned shape beats a split one. Among equal gradients it prefers
the node holding more allocations: a node empties only when its last
allocation leaves, so one more allocation delays that least on a node that
already waits on many (with memoryless lease lengths the delay is 1/(k+1)
of a lease); then the node whose oldest allocation is oldest, since lease
lengths are heavy-tailed and an old lease tends to run on.

Lease ends. A lease sold for a reserved term (`Allocation.lease_hours`) has a
known end, and a host empties when its last lease ends. Whole-node demand
(8-GPU slices, baremetal) is served only by empty hosts, so `default` adds to
the gradient what a lease costs in *time*: how many hours it moves the host's
emptying later (`extension`), at `weight` expected stranded GPUs per hour
(`fleet.placement.lease_end_weight`). Among hosts it does not delay, the one
that empties soonest after the lease ends wins (`slack`: leases ending around
the same time share a host, and the hosts that stay busy longest are kept for
the long leases). This is lifetime-aware packing in the spirit of LAVA / NILAS
(Barbalho et al., "LAVA: Lifetime-Aware VM Allocation", 2023), with the
lifetime a product term instead of a prediction. A request without a lease
end, and every baseline, ranks exactly as without this rule; a host holding
an on-demand lease (no end) never empties on schedule (`math.inf`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from desired.models import TopologyRule
from policies import topology as t


class Policy(enum.StrEnum):
    DEFAULT = "default"
    FIRST_FIT = "first-fit"
    LEAST_ALLOCATED = "k8s-least-allocated"
    MOST_ALLOCATED = "k8s-most-allocated"
    SEED_RANK = "seed-rank"


BASELINES = (Policy.FIRST_FIT, Policy.LEAST_ALLOCATED, Policy.MOST_ALLOCATED, Policy.SEED_RANK)
ALL = (Policy.DEFAULT, *BASELINES)


@dataclass(frozen=True, slots=True)
class Demand:
    """One request class of the expected workload: size, topology rule, weight."""

    gpu_count: int
    rule: TopologyRule
    weight: float


Mix = tuple[Demand, ...]


def mix(shares: Mapping[int, float], rules: Mapping[int, TopologyRule], *, whole_node: bool) -> Mix:
    """The demands one node view faces.

    `shares` is the fleet's expected request-size mix (GPU count -> share of
    requests); `rules` the SKU's topology rule for each count it sells. A
    count the SKU does not sell still matters as a whole-node demand when the
    node can also be leased as baremetal (`whole_node`).
    """
    out = []
    for g in sorted(shares):
        w = float(shares[g])
        if w <= 0:
            continue
        if g in rules:
            out.append(Demand(g, rules[g], w))
        elif whole_node and g >= 8:
            out.append(Demand(g, TopologyRule.FULL_HOST_SLOT_GROUP_REQUIRED, w))
    return tuple(out)


def fragmentation(lay: t.Layout, free: int, demands: Mix) -> float:
    """Expected free GPUs stranded for a request drawn from `demands`."""
    return sum(d.weight * t.stranded(lay, free, d.gpu_count, d.rule) for d in demands)


def gradient(lay: t.Layout, free: int, take: int, demands: Mix) -> float:
    """How much taking `take` raises the node's fragmentation (FGD's score)."""
    return fragmentation(lay, free & ~take, demands) - fragmentation(lay, free, demands)


@dataclass(frozen=True, slots=True)
class Option:
    """Facts about one candidate placement on one node, for ranking."""

    choice: t.Choice
    free_before: int
    free_after: int
    size: int
    gradient: float
    opens: bool  # the node had no claim on its sellable slots before


def in_node(policy: Policy, lay: t.Layout, free: int, options: Iterable[t.Choice], demands: Mix) -> t.Choice | None:
    """The slots a policy takes on a node, among the topology-safe choices."""
    opts = list(options)
    if not opts:
        return None
    if policy is Policy.DEFAULT:
        return min(opts, key=lambda c: (c.tier, gradient(lay, free, c.mask, demands), t.positions(c.mask)))
    if policy is Policy.SEED_RANK:
        return min(opts, key=lambda c: (c.groups_used, t.positions(c.mask)))
    # first-fit and the Kubernetes scores know nothing of topology: lowest slots.
    return min(opts, key=lambda c: t.positions(c.mask))


def option(policy: Policy, lay: t.Layout, free: int, g: int, rule: TopologyRule, *, demands: Mix) -> Option | None:
    """The policy's best placement of `g` GPUs on a node with this free mask."""
    choice = in_node(policy, lay, free, t.choices(lay, free, g, rule), demands)
    if choice is None:
        return None
    before = t.popcount(free & lay.full)
    return Option(
        choice, before, before - g, lay.size, gradient(lay, free, choice.mask, demands), (free & lay.full) == lay.full
    )


def rank(policy: Policy, o: Option) -> tuple[float, ...]:
    """Node-level key (lower wins) from facts that are equal for symmetric nodes."""
    if policy is Policy.DEFAULT:
        return (float(o.opens), float(o.choice.tier), round(o.gradient, 9))
    if policy is Policy.LEAST_ALLOCATED:
        return (-float(o.free_after * 100 // o.size),)
    if policy is Policy.MOST_ALLOCATED:
        return (-float((o.size - o.free_after) * 100 // o.size),)
    if policy is Policy.SEED_RANK:
        single = o.choice.groups_used == 1
        return (0.0 if single else 1.0, float(o.free_after), float(o.choice.groups_used))
    return ()


HOUR_S = 3600.0
# `place_key` compares the oldest request on a node by classes this long (in the planner's seconds), then the
# gradient. Measured on the workload suite (docs/placement.md, "Workload suite"): 4 h beat exact times there.
AGE_CLASS_S = 4 * HOUR_S
NO_END = math.inf  # the end of a lease without a term: it runs until released
EMPTY = -math.inf  # the "end" of a node without allocations


def uses_lease_ends(policy: Policy) -> bool:
    """Does the policy rank by lease ends? Only `default`: the baselines are the standard algorithms."""
    return policy is Policy.DEFAULT


def node_end(lease_ends: Iterable[float]) -> float:
    """When a node empties: its latest lease end; `NO_END` if one lease has none; `EMPTY` with no lease."""
    return max(lease_ends, default=EMPTY)


def extension(node_end: float, start: float, end: float) -> float:
    """Seconds a lease from `start` to `end` moves the node's emptying later (0 when it ends first).

    An empty node is busy from `start`; a lease already past its end (not yet
    released) still counts from its end.
    """
    busy_until = start if node_end == EMPTY else node_end
    return max(0.0, end - busy_until)


def slack(node_end: float, start: float, end: float) -> float:
    """How long the node stays busy after the lease ends; 0 when the lease outlasts it."""
    busy_until = start if node_end == EMPTY else node_end
    return max(0.0, busy_until - end)


def lease_rank(
    sig_rank: tuple[float, ...], node_end: float, start: float, end: float, weight: float
) -> tuple[float, ...]:
    """`default`'s node key for a lease with a known end (lower wins).

    `sig_rank` is `rank(Policy.DEFAULT, option)`: (opens, tier, gradient).
    The gradient grows by `weight` per hour of `extension`; at equal cost the
    smaller extension (so with `weight` 0 an undelayed node still wins), then
    the least `slack` (tightest fit in time). Node order tie-breaks follow.
    """
    opens, tier, grad = sig_rank
    busy_until = start if node_end == EMPTY else node_end  # extension() and slack(), inlined: a hot path
    if end > busy_until:
        ext = end - busy_until
        return (opens, tier, round(grad + weight * ext / HOUR_S, 9), ext, 0.0)
    return (opens, tier, grad, 0.0, busy_until - end)


def interleaves(policy: Policy) -> bool:
    """Does the policy rank node facts (allocations, age) between its pattern scores? Only `default`."""
    return policy is Policy.DEFAULT


def _spread(tier: float) -> float:
    return float(tier >= t.TIER_SPREAD)


def place_key(sig_rank: tuple[float, ...], node: tuple[float, ...]) -> tuple[float, ...]:
    """`default`'s full key for a lease without an end (lower wins).

    `sig_rank` is `rank(Policy.DEFAULT, option)` (opens, tier, gradient) and
    `node` the node's `node_key` (-allocations, oldest, order). Measured on
    on-demand streams (docs/placement.md, "On demand"): never a clean node
    while a used one fits; never a set that spans NUMA groups while an
    aligned one fits; then the node holding the most allocations (it empties
    last anyway: every one of them must leave, so nodes with few keep
    draining for whole-node demand), then the aligned shape, then the node
    whose oldest allocation is oldest (heavy tails: it runs on), and only then
    the fragmentation gradient.

    The oldest request is compared by `AGE_CLASS_S` class first, then the
    gradient, then the exact time: two nodes pinned by allocations requested
    within the same few hours are equally likely to stay busy, and between
    them the one the placement fragments less wins (issue 31: this kept more
    of the gap on the 8-GPU-heavy and bursty families of the workload suite).
    """
    opens, tier, grad = sig_rank
    allocs, oldest, order = node
    return (opens, _spread(tier), allocs, tier, oldest // AGE_CLASS_S, grad, oldest, order)


def place_bound(sig_rank: tuple[float, ...]) -> tuple[float, ...]:
    """The part of `place_key` a pattern fixes before any node fact: patterns sorted by rank have it non-decreasing."""
    return (sig_rank[0], _spread(sig_rank[1]))


def lease_key(lease: tuple[float, ...], node: tuple[float, ...]) -> tuple[float, ...]:
    """`default`'s full key for a lease with an end: `lease_rank`'s terms, placed as in `place_key`.

    (opens, spread, -allocations, tier, gradient + weight x extension,
    extension, slack, oldest, order): the allocation count still comes before
    the lease-end cost. With rounded terms (an upper bound, many leases
    released early) this keeps more of the oracle's gain than ranking by
    the end first.
    """
    opens, tier, cost, ext, slack_s = lease
    allocs, oldest, order = node
    return (opens, _spread(tier), allocs, tier, cost, ext, slack_s, oldest, order)


def lease_bound(sig_rank: tuple[float, ...], allocs: float) -> tuple[float, ...]:
    """A lower bound on `lease_key[:5]` for every node of a pattern with this allocation count.

    The cost is the gradient plus a non-negative delay term, so a group whose
    bound exceeds the best key's first five elements cannot win.
    """
    opens, tier, grad = sig_rank
    return (opens, _spread(tier), allocs, tier, grad)


def slot_tiebreak(policy: Policy) -> bool:
    """Does the policy break node ties by slot index before node order (seed 002)?"""
    return policy is Policy.SEED_RANK


def node_key(policy: Policy, order: int, allocations: int, oldest: float = 0.0) -> tuple[float, ...]:
    """Tie-break among nodes with equal rank: deterministic, node order last.

    `default` prefers the node that holds more allocations, then the one whose
    oldest allocation was requested earliest (`oldest`, seconds): cloud lease
    lengths are heavy-tailed, so an allocation that has already run long is
    likely to run on, and a node pinned by it loses little by taking one more.
    Under `default` these are not only tie-breaks: `place_key` and
    `lease_key` put them between the pattern's scores.
    """
    if policy is Policy.DEFAULT:
        return (-allocations, oldest, order)
    return (order,)


def baremetal_key(policy: Policy, order: int, slice_capable: bool) -> tuple[int, ...]:
    """Which empty node a whole-node lease takes.

    `default` leases nodes that cannot serve slices first, so slice-capable
    hosts stay available to both products; baselines take the lowest node.
    """
    if policy is Policy.DEFAULT:
        return (int(slice_capable), order)
    return (order,)
