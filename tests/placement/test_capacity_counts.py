"""Launchable counts without moving a node equal placing probes until one is refused.

`capacity.fill` used to place and release one probe request at a time until
the engine refused (about 320,000 index moves for a PR plan at 10,000
nodes). `Engine.launchable` counts each node's share from its free pattern
instead; both must give the same count and the same refusal for every
policy, size, tenant and fragmentation, and the engine must be untouched.
"""

from __future__ import annotations

import random

import pytest

from desired import models as m
from policies import packing
from reconciler.placement import capacity, placing, synthesis
from tests.placement.pictures import REGION, SLICE, world

POLICIES = [p.value for p in packing.ALL]


def _snapshot(engine: placing.Engine) -> list[tuple[str, int]]:
    return sorted((n.name, n.claimed) for n in engine.nodes)


def _compare(engine: placing.Engine, regions: list[str], tenants: list[str]) -> int:
    compared = 0
    for sku in sorted(engine.skus.values(), key=lambda s: s.sku):
        if sku.capacity_shape is not m.CapacityShape.GPU_SLICE:
            continue
        for region in regions:
            for tenant in tenants:
                for g in sku.counts:
                    for limit in (capacity.DEFAULT_LIMIT, 3):
                        before = _snapshot(engine)
                        fast = engine.launchable(sku.sku, region, g, tenant=tenant, limit=limit)
                        assert _snapshot(engine) == before  # nothing moved
                        slow = capacity.probe_fill(engine, sku.sku, region, g, tenant=tenant, limit=limit)
                        assert _snapshot(engine) == before
                        assert fast == slow, (sku.sku, region, tenant, g, limit)
                        compared += 1
    return compared


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2])
def test_counts_equal_probing_on_a_fragmented_synthetic_fleet(policy: str, seed: int) -> None:
    desired = synthesis.desired_state(synthesis.fleet_documents(12, amd_share=0.25, seed=seed))
    engine = placing.Engine(desired, policy=policy)
    rng = random.Random(seed)  # noqa: S311 - a reproducible edit sequence, not a secret
    regions = sorted({f.region for f in engine.facts})
    slices = sorted(s.sku for s in desired.skus.values() if s.capacity_shape is m.CapacityShape.GPU_SLICE)
    held: list[str] = []
    compared = 0
    for step in range(160):
        if held and rng.random() < 0.35:
            engine.release(held.pop(rng.randrange(len(held))))
        else:
            sku = rng.choice(slices)
            g = rng.choice(desired.skus[sku].counts)
            aid = f"a{step}"
            if isinstance(engine.place(placing.Request(aid, "t", sku, g, rng.choice(regions))), placing.Placed):
                held.append(aid)
        if step % 40 == 39:
            compared += _compare(engine, regions, [""])
    assert compared > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_counts_equal_probing_with_dedicated_unhealthy_and_blocked_nodes(policy: str) -> None:
    w = world("""
        d1: [a...|b.c.] org=acme
        d2: [....|....] org=acme
        s1: [d.e.|....]
        s2: [fg..|h...]
        s3: [-...|..#~]
        s4: [....|....] unhealthy
        s5: [....|....] draining
        """)
    engine = placing.Engine(w.desired, w.observed, policy=policy)
    assert _compare(engine, [REGION, "elsewhere"], ["", "acme", "globex"]) > 0
    # the refusal after a full fleet names the capacity that is left
    n, refusal = engine.launchable(SLICE, REGION, 8, tenant="", limit=capacity.DEFAULT_LIMIT)
    assert refusal is not None and n == capacity.probe_fill(engine, SLICE, REGION, 8)[0]
