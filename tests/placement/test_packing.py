"""Packing scores (policies.packing): in-node choice and node rank per policy.

Layout: an H200 host, numa0 (0 1)(2 3) | numa1 (4 5)(6 7). Pictures: '.'
free, 'x' taken.
"""

from __future__ import annotations

import pytest

from desired.models import TopologyRule as R
from policies import packing as pk
from policies import topology as t
from policies.packing import Policy as P

H200 = t.layout_of([(f"numa{s // 4}", f"pair{s // 2}") for s in range(8)])
RULES = {
    1: R.ANY_HEALTHY_SLOT,
    2: R.NUMA_ALIGNED_PREFERRED,
    4: R.NUMA_ALIGNED_REQUIRED,
    8: R.FULL_HOST_SLOT_GROUP_REQUIRED,
}
MIX = pk.mix({1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15}, RULES, whole_node=True)


def free(picture: str) -> int:
    return sum(1 << i for i, ch in enumerate(picture.replace("|", "")) if ch == ".")


def take(policy: P, picture: str, g: int) -> str:
    choice = pk.in_node(policy, H200, free(picture), t.choices(H200, free(picture), g, RULES[g]), MIX)
    assert choice is not None
    return "".join(str(p) for p in choice.positions)


@pytest.mark.parametrize(
    ("policy", "picture", "g", "slots"),
    [
        # default never breaks a clean group for one GPU when a fragmented one can take it
        (P.DEFAULT, "....|xxx.", 1, "7"),
        (P.DEFAULT, "x...|....", 1, "1"),  # completes the broken pair, keeps pair (2 3) whole
        (P.DEFAULT, "x...|x...", 2, "23"),  # an aligned pair, not a split one
        (P.DEFAULT, "xx..|....", 2, "23"),  # fills the broken group, keeps numa1 for a 4
        (P.DEFAULT, "x...|....", 4, "4567"),
        # first-fit and the Kubernetes scores take the lowest slots
        (P.FIRST_FIT, "....|xxx.", 1, "0"),
        (P.LEAST_ALLOCATED, "x...|x...", 2, "12"),
        (P.MOST_ALLOCATED, "....|xxx.", 1, "0"),
        # seed-rank: a single-NUMA set, then the lowest slots
        (P.SEED_RANK, "....|xxx.", 1, "0"),
        (P.SEED_RANK, "xxx.|x...", 2, "56"),
    ],
)
def test_in_node(policy: P, picture: str, g: int, slots: str) -> None:
    assert take(policy, picture, g) == slots


def option(policy: P, picture: str, g: int) -> pk.Option:
    o = pk.option(policy, H200, free(picture), g, RULES[g], demands=MIX)
    assert o is not None
    return o


@pytest.mark.parametrize(
    ("policy", "better", "worse", "g"),
    [
        # default: a node already in use before a clean one ...
        (P.DEFAULT, "xxxx|xxx.", "....|....", 1),
        # ... an aligned pair before a split one, even on a fuller node
        # ... and the smallest rise in expected stranded GPUs
        (P.DEFAULT, "xxxx|xxx.", "xxxx|xx..", 1),
        # most-allocated packs, least-allocated spreads
        (P.MOST_ALLOCATED, "xxxx|xx..", "x...|....", 1),
        (P.LEAST_ALLOCATED, "x...|....", "xxxx|xx..", 1),
        # seed-rank: single-NUMA fit first, then fewest remaining slots
        (P.SEED_RANK, "x...|....", "xxx.|xxx.", 2),
        (P.SEED_RANK, "xxxx|xx..", "xx..|xx..", 2),
    ],
)
def test_rank_orders_nodes(policy: P, better: str, worse: str, g: int) -> None:
    assert pk.rank(policy, option(policy, better, g)) < pk.rank(policy, option(policy, worse, g))


def test_first_fit_ranks_every_fit_equal() -> None:
    assert pk.rank(P.FIRST_FIT, option(P.FIRST_FIT, "xxxx|xxx.", 1)) == pk.rank(
        P.FIRST_FIT, option(P.FIRST_FIT, "....|....", 1)
    )


@pytest.mark.parametrize(
    ("picture", "expected"),
    [
        ("....|....", 0.0),
        # 7 free: stranded for 8 (7), for 4 (3), for 2 (1), for 1 (0)
        ("x...|....", 0.15 * 7 + 0.2 * 3 + 0.25 * 1),
        ("xxxx|xxxx", 0.0),
    ],
)
def test_fragmentation(picture: str, expected: float) -> None:
    assert pk.fragmentation(H200, free(picture), MIX) == pytest.approx(expected)


def test_gradient_is_the_rise_in_fragmentation() -> None:
    before = free("x...|....")
    one = 1 << 1
    assert pk.gradient(H200, before, one, MIX) == pytest.approx(
        pk.fragmentation(H200, before & ~one, MIX) - pk.fragmentation(H200, before, MIX)
    )


def test_mix_keeps_whole_node_demand_only_for_baremetal_capable_nodes() -> None:
    rules = {1: R.ANY_HEALTHY_SLOT, 2: R.NUMA_ALIGNED_REQUIRED}
    shares = {1: 0.5, 2: 0.3, 8: 0.2}
    assert [d.gpu_count for d in pk.mix(shares, rules, whole_node=False)] == [1, 2]
    whole = pk.mix(shares, rules, whole_node=True)
    assert [(d.gpu_count, d.rule) for d in whole][-1] == (8, R.FULL_HOST_SLOT_GROUP_REQUIRED)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (P.DEFAULT, [(0, 3), (0, 7), (1, 1)]),  # baremetal-only nodes first, then node order
        (P.FIRST_FIT, [(1, 1), (0, 3), (0, 7)]),
        (P.SEED_RANK, [(1, 1), (0, 3), (0, 7)]),
    ],
)
def test_baremetal_key(policy: P, expected: list[tuple[int, int]]) -> None:
    nodes = [(1, 1), (0, 7), (0, 3)]  # (slice_capable, order)
    assert sorted(nodes, key=lambda n: pk.baremetal_key(policy, n[1], bool(n[0]))) == expected


def test_node_key_default_prefers_the_node_with_more_allocations() -> None:
    assert pk.node_key(P.DEFAULT, 9, 3) < pk.node_key(P.DEFAULT, 1, 1)
    assert pk.node_key(P.DEFAULT, 9, 2, oldest=100.0) < pk.node_key(P.DEFAULT, 1, 2, oldest=200.0)
    assert pk.node_key(P.FIRST_FIT, 1, 1) < pk.node_key(P.FIRST_FIT, 9, 3)
    assert pk.node_key(P.FIRST_FIT, 1, 1, oldest=200.0) < pk.node_key(P.FIRST_FIT, 9, 1, oldest=100.0)


# ------------------------------------------------------------- lease ends

H = pk.HOUR_S
INF = pk.NO_END


@pytest.mark.parametrize(
    ("ends", "expected"),
    [
        ([], pk.EMPTY),  # no allocation: empty already
        ([2 * H, 9 * H, 5 * H], 9 * H),  # the last lease to end
        ([2 * H, INF], INF),  # an on-demand lease never ends on schedule
    ],
)
def test_node_end(ends: list[float], expected: float) -> None:
    assert pk.node_end(ends) == expected


@pytest.mark.parametrize(
    ("node_end", "start", "end", "extension", "slack"),
    [
        (10 * H, 0.0, 4 * H, 0.0, 6 * H),  # ends inside the node's busy time: no delay, 6 h slack
        (4 * H, 0.0, 4 * H, 0.0, 0.0),  # ends with the node's last lease: a perfect fit
        (2 * H, 0.0, 4 * H, 2 * H, 0.0),  # outlasts the node's leases by 2 h
        (pk.EMPTY, 1 * H, 4 * H, 3 * H, 0.0),  # an empty node is busy for the whole lease
        (INF, 0.0, 4 * H, 0.0, INF),  # an on-demand lease pins the node: no delay, no fit
        (-1 * H, 0.0, 4 * H, 5 * H, 0.0),  # a lease past its end (not released yet) counts from its end
    ],
)
def test_extension_and_slack(node_end: float, start: float, end: float, extension: float, slack: float) -> None:
    assert pk.extension(node_end, start, end) == extension
    assert pk.slack(node_end, start, end) == slack


@pytest.mark.parametrize(
    ("sig_rank", "node_end", "end", "weight", "expected"),
    [
        # (opens, tier, gradient + weight x hours of delay, delay, slack)
        # no delay: the gradient stays, the slack tells how tight the fit is
        ((0.0, 0.0, 0.5), 10 * H, 4 * H, 1.0, (0.0, 0.0, 0.5, 0.0, 6 * H)),
        # 2 hours of delay at 1 stranded GPU per hour
        ((0.0, 0.0, 0.5), 2 * H, 4 * H, 1.0, (0.0, 0.0, 2.5, 2 * H, 0.0)),
        ((0.0, 0.0, 0.5), 2 * H, 4 * H, 0.25, (0.0, 0.0, 1.0, 2 * H, 0.0)),
        # weight 0: lease ends only break ties
        ((0.0, 0.0, 0.5), 2 * H, 4 * H, 0.0, (0.0, 0.0, 0.5, 2 * H, 0.0)),
        # opening a clean node and the topology tier are untouched
        ((1.0, 2.0, 0.0), pk.EMPTY, 4 * H, 1.0, (1.0, 2.0, 4.0, 4 * H, 0.0)),
    ],
)
def test_lease_rank(
    sig_rank: tuple[float, ...], node_end: float, end: float, weight: float, expected: tuple[float, ...]
) -> None:
    assert pk.lease_rank(sig_rank, node_end, 0.0, end, weight) == pytest.approx(expected)


_SAME_GRADIENT = [
    # same pattern: a node the lease does not delay before one it delays
    (((0.0, 0.0, 0.0), 5 * H), ((0.0, 0.0, 0.0), 3 * H)),
    # both undelayed: the node that empties soonest after the lease (leases end together)
    (((0.0, 0.0, 0.0), 5 * H), ((0.0, 0.0, 0.0), 9 * H)),
    # a known end before an on-demand lease that never empties on schedule
    (((0.0, 0.0, 0.0), 9 * H), ((0.0, 0.0, 0.0), INF)),
    # both delayed: the smaller delay
    (((0.0, 0.0, 0.0), 3 * H), ((0.0, 0.0, 0.0), 1 * H)),
    # a used node before a clean one, an aligned set before a split one, whatever the ends
    (((0.0, 0.0, 0.0), 1 * H), ((1.0, 0.0, 0.0), pk.EMPTY)),
    (((0.0, 0.0, 0.0), 1 * H), ((0.0, 1.0, 0.0), 5 * H)),
]


@pytest.mark.parametrize(
    ("weight", "better", "worse"),
    [
        *((1.0, b, w) for b, w in _SAME_GRADIENT),
        *((0.0, b, w) for b, w in _SAME_GRADIENT),  # weight 0: the ends still break ties
        # a small rise in fragmentation beats an hour of delay ...
        (1.0, ((0.0, 0.0, 0.6), 5 * H), ((0.0, 0.0, 0.0), 3 * H)),
        # ... a large one does not
        (1.0, ((0.0, 0.0, 0.0), 3 * H), ((0.0, 0.0, 1.5), 5 * H)),
        # weight 0: the gradient alone
        (0.0, ((0.0, 0.0, 0.0), 3 * H), ((0.0, 0.0, 0.6), 5 * H)),
    ],
)
def test_lease_rank_orders_nodes(
    weight: float, better: tuple[tuple[float, ...], float], worse: tuple[tuple[float, ...], float]
) -> None:
    end = 4 * H  # a lease from 0 to 4 h, `weight` stranded GPUs per hour of delay
    assert pk.lease_rank(better[0], better[1], 0.0, end, weight) < pk.lease_rank(worse[0], worse[1], 0.0, end, weight)


def test_only_default_reads_lease_ends() -> None:
    assert [p for p in pk.ALL if pk.uses_lease_ends(p)] == [P.DEFAULT]
