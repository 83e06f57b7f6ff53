"""Dedicated nodes first (seed 002: `org` null = shared).

A node with `org` serves that tenant before any shared node does; the
tenant falls back to shared nodes only when its own cannot take the
request; other tenants never land on it. Every policy keeps the rule (it
orders the partitions a request sees, not the score inside them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from policies import packing
from reconciler import plans, sources
from reconciler.placement import planner, reasons
from tests.placement.pictures import BAREMETAL, SLICE, world

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"
POLICIES = [p.value for p in packing.ALL]

# (story, picture, tenant, sku, gpus, expected node or pending code)
CASES = [
    (
        "own clean node beats a shared node already in slice use (which every policy otherwise prefers)",
        """
     s1: [a...|....]
     d1: [....|....] org=acme
     """,
        "acme",
        SLICE,
        1,
        "d1",
    ),
    (
        "own node beats a lower-named shared node",
        """
     a1: [....|....]
     z1: [....|....] org=acme
     """,
        "acme",
        SLICE,
        4,
        "z1",
    ),
    (
        "full dedicated pool: the tenant falls back to the shared node",
        """
     d1: [abcd|efgh] org=acme
     d2: [ijkl|mnop] org=acme
     s1: [....|....]
     """,
        "acme",
        SLICE,
        2,
        "s1",
    ),
    (
        "own node has free GPUs but no NUMA-aligned group of 4: shared node takes it",
        """
     d1: [a.b.|c.d.] org=acme
     s1: [....|....]
     """,
        "acme",
        SLICE,
        4,
        "s1",
    ),
    (
        "another tenant never lands on a dedicated node, even when the shared pool is full",
        """
     d1: [....|....] org=acme
     s1: [abcd|efgh]
     """,
        "globex",
        SLICE,
        1,
        reasons.CAPACITY,
    ),
    (
        "another tenant with only dedicated nodes of others: tenant boundary",
        """
     d1: [....|....] org=acme
     d2: [....|....] org=acme
     """,
        "globex",
        SLICE,
        1,
        reasons.TENANT_BOUNDARY,
    ),
    (
        "a tenant's dedicated node of someone else is not its own",
        """
     d1: [....|....] org=acme
     s1: [a...|....]
     """,
        "globex",
        SLICE,
        1,
        "s1",
    ),
    (
        "baremetal: the tenant's own empty node first",
        """
     b01: [] bm-only
     b02: [] bm-only org=acme
     """,
        "acme",
        BAREMETAL,
        8,
        "b02",
    ),
    (
        "baremetal: own node holds a lease, fall back to a shared empty node",
        """
     b01: [] bm-only
     b02: [AAAA|AAAA] org=acme
     """,
        "acme",
        BAREMETAL,
        8,
        "b01",
    ),
    (
        "baremetal: another tenant never leases the dedicated node",
        """
     b01: [AAAA|AAAA]
     b02: [....|....] org=acme
     """,
        "globex",
        BAREMETAL,
        8,
        reasons.NO_EMPTY_NODE,
    ),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("story", "picture", "tenant", "sku", "gpus", "expected"), CASES, ids=[c[0][:60] for c in CASES]
)
def test_dedicated_nodes_first(  # noqa: PLR0917  # one parameter per table column
    story: str, picture: str, tenant: str, sku: str, gpus: int, expected: str, policy: str
) -> None:
    w = world(picture)
    got = w.place(sku, gpus, tenant=tenant, policy=policy)
    where = got if isinstance(got, str) else got[0]
    assert where == expected, story


def test_full_dedicated_pool_and_a_request_from_another_tenant_in_one_plan() -> None:
    """
    d1: [abc.|....] org=acme
    s1: [defg|hij.]
    The globex request takes the last shared slot, never the acme node's free
    ones; the acme requests fill their own node first, then the shared pool is
    empty and the last one waits.
    """
    w = world(test_full_dedicated_pool_and_a_request_from_another_tenant_in_one_plan.__doc__)
    g = w.request(SLICE, 1, tenant="globex")
    acme = [w.request(SLICE, 1, tenant="acme") for _ in range(5)]
    g2 = w.request(SLICE, 1, tenant="globex")
    result = w.plan()
    placed = {p.allocation_id: p.node for p in result.placements}
    pending = {p.allocation_id: p.code for p in result.pending}
    assert placed[g] == "s1"
    assert [placed[a] for a in acme] == ["d1"] * 5
    assert pending == {g2: reasons.CAPACITY}


def test_alternatives_list_own_nodes_before_shared_ones() -> None:
    """
    d1: [....|....] org=acme
    d2: [....|....] org=acme
    s1: [a...|....]
    """
    w = world(test_alternatives_list_own_nodes_before_shared_ones.__doc__)
    aid = w.request(SLICE, 1, tenant="acme")
    result = planner.plan(w.desired, w.observed)
    p = next(p for p in result.placements if p.allocation_id == aid)
    assert p.node in {"d1", "d2"}
    assert [c.node for c in p.alternatives] == [({"d1", "d2"} - {p.node}).pop(), "s1"]


def test_shared_fallback_lists_no_dedicated_alternative() -> None:
    """
    d1: [abcd|efgh] org=acme
    s1: [....|....]
    s2: [....|....]
    """
    w = world(test_shared_fallback_lists_no_dedicated_alternative.__doc__)
    aid = w.request(SLICE, 1, tenant="acme")
    p = next(p for p in w.plan().placements if p.allocation_id == aid)
    assert p.node in {"s1", "s2"}
    assert [c.node for c in p.alternatives] == [({"s1", "s2"} - {p.node}).pop()]


def test_example_fleet_dedicated_baremetal_lease_lands_on_its_own_node() -> None:
    loaded = sources.load(EXAMPLES)
    assert not loaded.errors
    desired = loaded.state
    assert desired.nodes["h200-use1-b02"].org == desired.allocations["alloc-0004"].tenant == "acme-research"
    result = planner.plan(desired, plans.Observed())
    by_id = {p.allocation_id: p for p in result.placements}
    assert by_id["alloc-0004"].node == "h200-use1-b02"
    # no other tenant's allocation lands on the dedicated node
    for p in result.placements:
        org = desired.nodes[p.node].org
        assert org is None or org == desired.allocations[p.allocation_id].tenant


def test_avoided_nodes_are_never_chosen_and_stay_usable_for_others() -> None:
    """
    n1: [a...|....]
    n2: [....|....]
    """
    w = world(test_avoided_nodes_are_never_chosen_and_stay_usable_for_others.__doc__)
    w.request(SLICE, 1, aid="retry")
    w.observed = plans.Observed(claims=w.observed.claims, placed=w.observed.placed, avoid={"retry": frozenset({"n1"})})
    other = w.request(SLICE, 1)
    result = w.plan()
    placed = {p.allocation_id: p for p in result.placements}
    assert placed["retry"].node == "n2"
    assert all(c.node != "n1" for c in placed["retry"].alternatives)
    assert placed[other].node == "n1"  # the avoided node still serves everyone else
    w.observed = plans.Observed(
        claims=w.observed.claims, placed=w.observed.placed, avoid={"retry": frozenset({"n1", "n2"})}
    )
    pending = {p.allocation_id: p.code for p in w.plan().pending}
    assert pending["retry"] == reasons.CAPACITY
