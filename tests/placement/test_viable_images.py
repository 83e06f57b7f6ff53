"""No placement without a viable image (seed 002 §4; issue 26).

Regression: with no usable image, `plan` placed the request with `"image": null`
and the host then failed it with `host.image.none`. Now it stays pending with
`plan.image_unavailable` and the reason in its details.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from desired import models as m
from reconciler.placement import reasons, replanning
from tests.placement.pictures import API, BAREMETAL, EPOCH, SLICE, World, world

FLEET = """
    n1: [....|....]
    b1: [] bm-only
"""


def _image(slug: str, **over: Any) -> m.Image:
    doc: dict[str, Any] = {
        "apiVersion": API,
        "kind": "Image",
        "slug": slug,
        "target": "vm_slice",
        "family": "ubuntu",
        "architecture": "amd64",
        "image_format": "qcow2",
        "source_type": "platform_storage",
        "source_ref": f"images/{slug}.qcow2",
        "digest_sha256": "a" * 64,
        "default_username": "ubuntu",
        "driver_strategy": "none",
        **over,
    }
    return m.Image.model_validate(doc)


def _outcome(w: World, aid: str) -> tuple[str, str | None, dict[str, Any]]:
    plan = w.plan()
    for p in plan.placements:
        if p.allocation_id == aid:
            return "placed", p.image, {}
    for q in plan.pending:
        if q.allocation_id == aid:
            return "pending", q.code, dict(q.details)
    raise AssertionError(aid)


def test_no_image_at_all_stays_pending_with_the_reason() -> None:
    w = world(FLEET)
    w.desired.images = {}
    aid = w.request(SLICE, 1)
    bm = w.request(BAREMETAL, 8)
    assert _outcome(w, aid) == (
        "pending",
        reasons.IMAGE_UNAVAILABLE,
        {"image": None, "why": "none", "target": "vm_slice"},
    )
    assert _outcome(w, bm)[:2] == ("pending", reasons.IMAGE_UNAVAILABLE)
    message = next(q.message for q in w.plan().pending if q.allocation_id == aid)
    assert "no active image with a digest fits SKU h200-sxm-slice" in message


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"active": False, "inactive_since": "2025-01-01T00:00:00Z"}, "none"),  # inactive: never a default
        ({"target": "baremetal", "image_format": "maas", "source_type": "maas", "source_ref": "x"}, "none"),
        ({"compatible_skus": ["other-sku"]}, "none"),
        ({"accelerator_vendor": "amd"}, "none"),
    ],
)
def test_an_image_that_does_not_fit_is_no_default(over: dict[str, Any], why: str) -> None:
    w = world(FLEET)
    w.desired.images = {"only": _image("only", **over)}
    aid = w.request(SLICE, 1)
    assert _outcome(w, aid)[:2] == ("pending", reasons.IMAGE_UNAVAILABLE)
    assert _outcome(w, aid)[2]["why"] == why


def test_a_named_image_is_checked_too() -> None:
    """The planner does not trust validation alone: a named image that is not viable is not placed."""
    w = world(FLEET)
    w.desired.images = {"mine": _image("mine", digest_sha256=None)}
    aid = w.request(SLICE, 1)
    w.desired.allocations[aid] = w.desired.allocations[aid].model_copy(update={"image": "mine"})
    assert _outcome(w, aid) == (
        "pending",
        reasons.IMAGE_UNAVAILABLE,
        {"image": "mine", "why": "no_digest", "target": "vm_slice"},
    )
    w.desired.allocations[aid] = w.desired.allocations[aid].model_copy(update={"image": "gone"})
    assert _outcome(w, aid)[2]["why"] == "unknown"


def test_a_retired_image_stays_with_requests_made_before_it_retired() -> None:
    w = world(FLEET)
    retired = EPOCH + dt.timedelta(minutes=2)
    w.desired.images = {"old": _image("old", active=False, inactive_since=retired.isoformat())}
    early = w.request(SLICE, 1)  # EPOCH + 1 min
    late = w.request(SLICE, 1)  # EPOCH + 2 min: not before the retirement
    for aid in (early, late):
        w.desired.allocations[aid] = w.desired.allocations[aid].model_copy(update={"image": "old"})
    assert _outcome(w, early) == ("placed", "old", {})
    assert _outcome(w, late)[2]["why"] == "inactive"


def test_a_viable_image_places_and_the_warm_planner_agrees() -> None:
    w = world(FLEET)
    w.desired.images = {}
    aid = w.request(SLICE, 1)
    warm = replanning.WarmPlanner()
    assert [q.code for q in warm(w.desired, w.observed).pending] == [reasons.IMAGE_UNAVAILABLE]
    w.desired.images = {"good": _image("good")}
    assert _outcome(w, aid) == ("placed", "good", {})
    assert [p.image for p in warm(w.desired, w.observed).placements] == ["good"]


def test_an_invalid_sku_or_count_keeps_its_own_code() -> None:
    w = world(FLEET)
    w.desired.images = {}
    aid = w.request(SLICE, 3)
    assert _outcome(w, aid)[:2] == ("pending", reasons.GPU_COUNT)
