"""Placement prefers a node that already caches the allocation's image, only among equals.

The host reports its image cache (`node_image_cache`); the planner reads it
into `Observed.image_cache`. Among candidates of equal packing score the warm
node wins; a better-packed cold node always beats a warm one.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from desired import models as m
from policies import packing
from reconciler.placement import placing
from tests.placement.pictures import API, BAREMETAL, REGION, SLICE, World, world

POLICIES = [p.value for p in packing.ALL]
WARM = "a" * 64
OTHER = "b" * 64


def _warm(w: World, cache: dict[str, set[str]]) -> World:
    observed = dataclasses.replace(
        w.observed, image_cache=MappingProxyType({n: frozenset(ds) for n, ds in cache.items()})
    )
    return World(w.desired, observed, w.claims)


def _place(w: World, sku: str, gpus: int, digest: str | None, policy: str) -> str:
    engine = placing.Engine(w.desired, w.observed, policy=policy)
    out = engine.place(placing.Request("new", "t", sku, gpus, REGION, image_digest=digest))
    assert isinstance(out, placing.Placed), out
    return out.node


@pytest.mark.parametrize("policy", POLICIES)
def test_equal_nodes_the_warm_one_wins(policy: str) -> None:
    w = _warm(
        world("""
        a1: [....|....]
        a2: [....|....]
        a3: [....|....]
        """),
        {"a2": {WARM}, "a3": {OTHER}},
    )
    assert _place(w, SLICE, 1, None, policy) == "a1"  # node order decides without an image
    assert _place(w, SLICE, 1, OTHER, policy) == "a3"
    assert _place(w, SLICE, 1, WARM, policy) == "a2"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_better_packed_cold_node_beats_a_warm_one(policy: str) -> None:
    picture = """
        a1: [ab..|....]
        a2: [....|....]
        a3: [c...|....]
        """
    cold = _place(world(picture), SLICE, 1, None, policy)
    for warm_node in ("a1", "a2", "a3"):
        w = _warm(world(picture), {warm_node: {WARM}})
        got = _place(w, SLICE, 1, WARM, policy)
        if policy == packing.Policy.FIRST_FIT.value:
            # first-fit scores every fitting node the same (node order only): the warm one is an equal
            assert got == warm_node
        else:
            # a1, a2 and a3 differ in use, and every other policy scores use
            assert got == cold, (warm_node, policy)


@pytest.mark.parametrize("policy", POLICIES)
def test_baremetal_takes_the_warm_empty_node(policy: str) -> None:
    w = _warm(
        world("""
        b01: [] bm-only
        b02: [] bm-only
        b03: [AAAA|AAAA] bm-only
        """),
        {"b02": {WARM}, "b03": {WARM}},
    )
    assert _place(w, BAREMETAL, 8, None, policy) == "b01"
    assert _place(w, BAREMETAL, 8, WARM, policy) == "b02"


def test_the_planner_passes_the_allocations_image_digest() -> None:
    w = world("""
        a1: [....|....]
        a2: [....|....]
        """)
    w.desired.images["slice-img"] = m.Image.model_validate(
        {
            "apiVersion": API,
            "kind": "Image",
            "slug": "slice-img",
            "display_name": "x",
            "version": "1",
            "target": "vm_slice",
            "family": "ubuntu",
            "architecture": "amd64",
            "accelerator_vendor": "nvidia",
            "image_format": "qcow2",
            "source_type": "http",
            "source_ref": "https://images.invalid/x.qcow2",
            "digest_sha256": WARM,
            "driver_strategy": "none",
            "default_username": "ubuntu",
        }
    )
    aid = w.request(SLICE, 2)
    assert {p.allocation_id: p.node for p in w.plan().placements}[aid] == "a1"
    warm = _warm(w, {"a2": {WARM}})
    placement = {p.allocation_id: p for p in warm.plan().placements}[aid]
    assert placement.node == "a2"
    assert placement.image == "slice-img"  # the image the allocation gets is the one whose digest was looked up
