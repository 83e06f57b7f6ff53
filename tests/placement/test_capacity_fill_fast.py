"""Whole-node launchable counts without moving a node equal placing probes until one is refused.

`capacity.fill` placed and released one probe per empty node for a baremetal
SKU (10,000 index moves per size at 10,000 nodes). `Engine.whole_launchable`
counts the empty nodes the request's tiers admit instead; both must give the
same count and the same refusal (code, message, details) on any fleet: orgs,
regions, draining, maintenance, unhealthy, cleanup, slice claims, other
leases, a fabric the SKU does not accept, an inactive SKU, a size it does not
sell, and limits below the count. The engine must be left as it was.
"""

from __future__ import annotations

import random
import string
from typing import Any

import pytest

from desired import models as m
from policies import packing
from reconciler import plans
from reconciler.placement import capacity, placing
from schemas import states
from tests.placement.pictures import BAREMETAL, REGION, SLICE, world

POLICIES = [p.value for p in packing.ALL]
TENANTS = ("", "acme", "globex")
REGIONS = (REGION, "r2", "nowhere")
_WORDS = (
    "draining",
    "maintenance",
    "unhealthy",
    "org=acme",
    "org=globex",
    "region=r2",
    "no-bm",
    "notag",
    "fw-off",
    "share",
)
_SLOT_MARKS = "....#~!-"


def _slots(rng: random.Random, i: int) -> str:
    """One node's picture between the brackets: free, slot claims, a whole-node lease or bad slots."""
    roll = rng.random()
    if roll < 0.15:
        return f"{string.ascii_uppercase[i] * 4}|{string.ascii_uppercase[i] * 4}"
    letters = string.ascii_lowercase[3 * i : 3 * i + 3]  # a node's own letters: one allocation, one node
    free_only = roll < 0.55
    marks = "".join("." if free_only else rng.choice(_SLOT_MARKS + letters) for _ in range(8))
    return f"{marks[:4]}|{marks[4:]}"


def _picture(rng: random.Random) -> str:
    lines = []
    for i in range(rng.randint(1, 8)):
        words = [w for w in _WORDS if rng.random() < 0.12]
        if rng.random() < 0.08:
            lines.append(f"n{i}: [] bm-only {' '.join(words)}")
        else:
            lines.append(f"n{i}: [{_slots(rng, i)}] {' '.join(words)}")
    return "\n".join(lines)


def _variant(rng: random.Random, sku: m.Sku) -> m.Sku:
    """The baremetal SKU as pictured, or on another fabric, or inactive (static refusals)."""
    roll = rng.random()
    if roll < 0.1:
        return sku.model_copy(update={"network_fabric": m.Fabric.ROCE})
    if roll < 0.15:
        return sku.model_copy(update={"active": False})
    return sku


_Snapshot = tuple[list[tuple[str, int, str | None]], list[int], list[tuple[str, str]]]


def _snapshot(engine: placing.Engine) -> _Snapshot:
    """Claims per node, the empty-node heaps and where every allocation is held."""
    nodes = sorted((n.name, n.claimed, n.exclusive) for n in engine.nodes)
    empty = sorted(nid for w in engine.state.whole_parts.values() for nid in w.empty.nodes())
    return nodes, empty, sorted((a, n.name) for a, n in engine.where.items())


def _churn(rng: random.Random, engine: placing.Engine) -> None:
    """Some leases placed and some released, so heaps hold nodes that came back."""
    held: list[str] = []
    for step in range(rng.randint(0, 10)):
        if held and rng.random() < 0.3:
            engine.release(held.pop(rng.randrange(len(held))))
            continue
        sku, g = rng.choice(((BAREMETAL, 8), (SLICE, 1), (SLICE, 2), (SLICE, 8)))
        req = placing.Request(f"churn-{step}", rng.choice(TENANTS), sku, g, rng.choice(REGIONS[:2]))
        if isinstance(engine.place(req), placing.Placed):
            held.append(req.allocation_id)


def _no_place(req: placing.Request, **_: Any) -> placing.Placed | placing.Refused:
    raise AssertionError(f"the fast path placed {req.allocation_id}")


def _compare(rng: random.Random, engine: placing.Engine) -> int:
    compared = 0
    for region in REGIONS:
        for tenant in TENANTS:
            for g in (8, 4):  # 4: a size the baremetal SKU does not sell
                for limit in (capacity.DEFAULT_LIMIT, rng.randint(0, 4)):
                    before = _snapshot(engine)
                    engine.place = _no_place  # type: ignore[method-assign]  # the fast path never places
                    try:
                        fast = capacity.fill(engine, BAREMETAL, region, g, tenant=tenant, limit=limit)
                    finally:
                        del engine.place
                    assert _snapshot(engine) == before
                    slow = capacity.probe_fill(engine, BAREMETAL, region, g, tenant=tenant, limit=limit)
                    assert _snapshot(engine) == before
                    assert fast == slow, (region, tenant, g, limit)
                    compared += 1
    return compared


@pytest.mark.parametrize("seed", range(100))
def test_whole_node_counts_equal_probing_on_random_fleets(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a reproducible fleet, not a secret
    w = world(_picture(rng))
    w.desired.skus[BAREMETAL] = _variant(rng, w.desired.skus[BAREMETAL])
    engine = placing.Engine(w.desired, w.observed, policy=rng.choice(POLICIES))
    _churn(rng, engine)
    assert _compare(rng, engine) == len(REGIONS) * len(TENANTS) * 2 * 2


def test_the_random_fleets_reach_every_outcome() -> None:
    """The property above is only worth something if its fleets place, cap and refuse in every way."""
    codes: set[str | None] = set()
    counts: set[int] = set()
    for seed in range(100):
        rng = random.Random(seed)  # noqa: S311 - the same fleets as above
        w = world(_picture(rng))
        w.desired.skus[BAREMETAL] = _variant(rng, w.desired.skus[BAREMETAL])
        engine = placing.Engine(w.desired, w.observed, policy=rng.choice(POLICIES))
        _churn(rng, engine)
        for region in REGIONS:
            for tenant in TENANTS:
                n, refusal = capacity.fill(engine, BAREMETAL, region, 8, tenant=tenant, limit=2)
                codes.add(refusal.code if refusal else None)
                counts.add(n)
    assert {0, 1, 2} <= counts
    assert {
        None,
        "plan.sku_unavailable.no_empty_node",
        "plan.sku_unavailable.no_node",
        "plan.sku_unavailable.fabric",
        "plan.sku_unavailable.tenant_boundary",
        "plan.sku_inactive",
    } <= codes


def test_dedicated_nodes_count_for_their_org_and_shared_for_everyone() -> None:
    w = world("""
        d1: [....|....] org=acme
        d2: [....|....] org=acme
        g1: [....|....] org=globex
        s1: [....|....]
        s2: [a...|....]
        s3: [BBBB|BBBB]
        s4: [....|....] draining
        """)
    engine = placing.Engine(w.desired, w.observed)
    assert capacity.fill(engine, BAREMETAL, REGION, 8, tenant="acme")[0] == 3
    assert capacity.fill(engine, BAREMETAL, REGION, 8, tenant="globex")[0] == 2
    n, refusal = capacity.fill(engine, BAREMETAL, REGION, 8)
    assert n == 1 and refusal is not None
    assert refusal == capacity.probe_fill(engine, BAREMETAL, REGION, 8)[1]
    assert capacity.fill(engine, BAREMETAL, REGION, 8, tenant="acme", limit=2) == (2, None)


def test_a_held_probe_id_falls_back_to_probing() -> None:
    """An allocation named like a probe changes what probing answers (place returns it as it is)."""

    def build() -> placing.Engine:
        w = world("""
            n1: [....|....]
            n2: [....|....]
            n3: [....|....]
            """)
        held = plans.ExistingClaim(
            f"{capacity.PROBE_PREFIX}1", "n1", states.ClaimKind.NODE_EXCLUSIVE, None, states.ClaimStatus.ACTIVE
        )
        observed = plans.Observed(claims=(held,), placed=frozenset({held.allocation_id}))
        return placing.Engine(w.desired, observed)

    assert build().whole_launchable(BAREMETAL, REGION, 8, limit=capacity.DEFAULT_LIMIT)[0] == 2
    slow = capacity.probe_fill(build(), BAREMETAL, REGION, 8)
    assert slow[0] == 3  # probe 1 answered by the held lease, not placed
    assert capacity.fill(build(), BAREMETAL, REGION, 8) == slow


def test_whole_launchable_refuses_slice_skus() -> None:
    w = world("n1: [....|....]")
    engine = placing.Engine(w.desired, w.observed)
    with pytest.raises(ValueError, match="slices"):
        engine.whole_launchable(SLICE, REGION, 1, limit=5)
