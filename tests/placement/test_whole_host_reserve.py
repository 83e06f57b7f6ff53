"""The planner's reserve of empty hosts for whole-host requests (`fleet.placement.whole_host_reserve`).

Policy `default` only. A request that is not whole-host (whole-host: a
baremetal SKU, or a slice of 8 GPUs) and whose pick would open an empty
host stays pending with `plan.sku_unavailable.reserved_for_whole_host`
while that host's pool has at most R empty hosts, R = min(max_hosts,
W - (after_pending - 1)), W the whole-host requests of the pass not placed
so far that the pool could serve (`reserving.Holding`).

The pictures (tests/placement/pictures.py): a-z slot claims, '.' free.
"""

from __future__ import annotations

from typing import Any

import pytest

from desired import models as m
from desired.reading import loading
from policies import validation
from reconciler.placement import reasons
from tests.placement.pictures import BAREMETAL, SLICE, World, world

ONE_EMPTY = """
n1: [abcd|efgh]
n2: [....|....]
"""
THREE_EMPTY = """
n1: [abcd|efgh]
n2: [....|....]
n3: [....|....]
n4: [....|....]
"""


def _reserve(w: World, max_hosts: int = 1, after_pending: int = 1) -> World:
    fleet = w.desired.fleet
    assert fleet is not None
    setting = m.WholeHostReserve(max_hosts=max_hosts, after_pending=after_pending)
    w.desired.fleet = fleet.model_copy(
        update={"placement": fleet.placement.model_copy(update={"whole_host_reserve": setting})}
    )
    return w


def _outcomes(w: World, policy: str | None = None) -> dict[str, Any]:
    """Allocation id -> its node when placed, else its pending code."""
    plan = w.plan(policy)
    return {p.allocation_id: p.node for p in plan.placements} | {q.allocation_id: q.code for q in plan.pending}


@pytest.mark.parametrize(("sku", "gpus"), [(SLICE, 8), (BAREMETAL, 8)])
def test_a_small_request_may_not_open_the_host_a_waiting_whole_host_request_needs(sku: str, gpus: int) -> None:
    """n2 is the only empty host. Oldest first, the 1-GPU request would open it and the whole-host one,
    requested after it, would find none; the reserve keeps n2 for the whole-host request."""
    plain = world(ONE_EMPTY)
    small, whole = plain.request(SLICE, 1), plain.request(sku, gpus)
    assert _outcomes(plain) == {small: "n2", whole: reasons.NO_EMPTY_NODE if sku == BAREMETAL else reasons.CAPACITY}
    held = _reserve(world(ONE_EMPTY))
    small, whole = held.request(SLICE, 1), held.request(sku, gpus)
    assert _outcomes(held) == {small: reasons.RESERVED, whole: "n2"}


def test_the_reason_says_how_many_hosts_are_kept_for_how_many_requests() -> None:
    w = _reserve(world(ONE_EMPTY), max_hosts=2)
    small = w.request(SLICE, 2)
    w.request(BAREMETAL, 8)
    w.request(SLICE, 8)
    [pending] = [q for q in w.plan().pending if q.allocation_id == small]
    assert pending.code == "plan.sku_unavailable.reserved_for_whole_host"
    assert dict(pending.details) == {
        "region": "r1",
        "pool": "p1",
        "empty_hosts": 1,
        "reserved_hosts": 2,
        "whole_host_waiting": 2,
        "max_hosts": 2,
        "after_pending": 1,
    }
    kept = "pool p1 in r1 has 1 empty host(s) left, no more than the 2 kept for the 2 whole-host request(s)"
    assert kept in pending.message


@pytest.mark.parametrize("setting", [None, 0])
def test_nothing_is_held_with_the_setting_absent_or_zero(setting: int | None) -> None:
    w = world(ONE_EMPTY) if setting is None else _reserve(world(ONE_EMPTY), max_hosts=setting)
    small, whole = w.request(SLICE, 1), w.request(SLICE, 8)
    assert _outcomes(w) == {small: "n2", whole: reasons.CAPACITY}


def test_nothing_is_held_when_no_whole_host_request_waits() -> None:
    w = _reserve(world(ONE_EMPTY), max_hosts=4)
    small, other = w.request(SLICE, 1), w.request(SLICE, 4)
    assert _outcomes(w) == {small: "n2", other: "n2"}


def test_a_whole_host_request_placed_earlier_in_the_pass_holds_nothing() -> None:
    """The whole-host request is older and takes n2 itself: no empty host is left to open or keep."""
    w = _reserve(world(THREE_EMPTY), max_hosts=1)
    whole, small = w.request(BAREMETAL, 8), w.request(SLICE, 1)
    out = _outcomes(w)
    assert out[whole] in {"n2", "n3", "n4"} and out[small] in {"n2", "n3", "n4"} - {out[whole]}


@pytest.mark.parametrize(
    ("max_hosts", "after_pending", "held"),
    [(1, 1, False), (2, 1, False), (3, 1, True), (4, 1, True), (3, 2, False), (4, 3, False)],
)
def test_max_hosts_and_after_pending_size_the_reserve(max_hosts: int, after_pending: int, held: bool) -> None:
    """Three empty hosts, three whole-host requests waiting behind a 1-GPU one: R = min(max_hosts,
    3 - (after_pending - 1)), and the 1-GPU request opens a host only while more than R are empty."""
    w = _reserve(world(THREE_EMPTY), max_hosts=max_hosts, after_pending=after_pending)
    small = w.request(SLICE, 1)
    wholes = [w.request(SLICE, 8), w.request(BAREMETAL, 8), w.request(SLICE, 8)]
    out = _outcomes(w)
    assert (out[small] == reasons.RESERVED) is held
    assert sum(out[x] in {"n2", "n3", "n4"} for x in wholes) == (3 if held else 2)


def test_a_small_request_that_fits_a_used_host_is_never_held() -> None:
    """
    n1: [a...|....]
    n2: [....|....]
    Only opening an empty host is held back: the 1-GPU request joins alloc-a on n1.
    """
    w = _reserve(world(test_a_small_request_that_fits_a_used_host_is_never_held.__doc__), max_hosts=4)
    small, whole = w.request(SLICE, 1), w.request(BAREMETAL, 8)
    assert _outcomes(w) == {small: "n1", whole: "n2"}


def test_only_whole_host_requests_the_pool_could_serve_count() -> None:
    """
    n1: [abcd|efgh]
    n2: [....|....]
    m1: [ijkl|mnop] region=r2
    q1: [....|....] pool=p2 no-bm
    The baremetal request in r2 waits for r2's hosts: it keeps nothing in r1. In r1, a baremetal request
    keeps n2 (pool p1 serves baremetal) but not q1 (pool p2 has no baremetal host): the 1-GPU request
    picks n2, is held there, and is picked again without p1's empty hosts: it opens q1.
    """
    picture = test_only_whole_host_requests_the_pool_could_serve_count.__doc__
    w = _reserve(world(picture))
    w.desired.nodes.pop("q1")
    w.desired.slot_maps.pop("q1")
    small, far = w.request(SLICE, 1), w.request(BAREMETAL, 8, region="r2")
    assert _outcomes(w) == {small: "n2", far: reasons.NO_EMPTY_NODE}
    w = _reserve(world(picture))
    small, whole = w.request(SLICE, 1), w.request(BAREMETAL, 8)
    assert _outcomes(w) == {small: "q1", whole: "n2"}
    w = _reserve(world(picture))
    small, whole = w.request(SLICE, 1), w.request(SLICE, 8)  # an 8-GPU slice may use either pool
    assert _outcomes(w) == {small: reasons.RESERVED, whole: "n2"}


def test_a_whole_host_request_with_no_viable_image_keeps_nothing() -> None:
    w = _reserve(world(ONE_EMPTY))
    small, whole = w.request(SLICE, 1), w.request(BAREMETAL, 8)
    w.desired.allocations[whole] = w.desired.allocations[whole].model_copy(update={"image": "no-such-image"})
    assert _outcomes(w) == {small: "n2", whole: reasons.IMAGE_UNAVAILABLE}


@pytest.mark.parametrize("policy", ["first-fit", "k8s-least-allocated", "k8s-most-allocated", "seed-rank"])
def test_the_other_policies_never_hold(policy: str) -> None:
    w = _reserve(world(ONE_EMPTY), max_hosts=4)
    small, whole = w.request(SLICE, 1), w.request(SLICE, 8)
    assert _outcomes(w, policy) == {small: "n2", whole: reasons.CAPACITY}


FLEET = """apiVersion: gpuaas.io/v1alpha1
kind: Fleet
name: f
regions: [{name: r, pools: [{name: p}]}]
placement:
  policy: default
  whole_host_reserve:
"""


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            "    max_hosts: -1\n",
            "fleet.yaml:8:16: desired.field.value: field 'placement.whole_host_reserve.max_hosts': "
            "Input should be greater than or equal to 0",
        ),
        (
            "    max_hosts: 2\n    after_pending: 0\n",
            "fleet.yaml:9:20: desired.field.value: field 'placement.whole_host_reserve.after_pending': "
            "Input should be greater than or equal to 1",
        ),
        (
            "    max_hosts: two\n",
            "fleet.yaml:8:16: desired.field.type: field 'placement.whole_host_reserve.max_hosts': "
            "Input should be a valid integer",
        ),
        (
            "    after_pending: 2\n",
            "fleet.yaml:7:3: desired.field.missing: required field 'placement.whole_host_reserve.max_hosts' is missing",
        ),
        (
            "    max_hosts: 2\n    hosts: 3\n",
            "fleet.yaml:9:5: desired.field.unknown: unknown field 'placement.whole_host_reserve.hosts'",
        ),
    ],
)
def test_a_bad_setting_is_a_field_error_at_its_line(given: str, said: str) -> None:
    result = validation.validate(loading.parse_files([("fleet.yaml", (FLEET + given).encode())]))
    assert said in [e.render() for e in result.errors]


@pytest.mark.parametrize(
    ("given", "setting"),
    [
        ("", None),
        ("    max_hosts: 2\n", m.WholeHostReserve(max_hosts=2, after_pending=1)),
        ("    max_hosts: 0\n    after_pending: 3\n", m.WholeHostReserve(max_hosts=0, after_pending=3)),
    ],
)
def test_a_good_setting_reads(given: str, setting: m.WholeHostReserve | None) -> None:
    text = FLEET.removesuffix("  whole_host_reserve:\n") + ("  whole_host_reserve:\n" + given if given else "")
    result = validation.validate(loading.parse_files([("fleet.yaml", text.encode())]))
    assert not result.errors
    assert result.state.fleet is not None and result.state.fleet.placement.whole_host_reserve == setting
