"""`policies.immutables.check`: which edits of a held allocation are refused (issue 26), as a table."""

from __future__ import annotations

from typing import Any

import pytest

from desired import models as m
from desired import problems as p
from desired.state import DesiredState
from policies import immutables
from tests.placement.pictures import API, BAREMETAL, EPOCH, REGION, SLICE, skus


def _state(**over: Any) -> DesiredState:
    state = DesiredState()
    state.skus = skus()
    doc: dict[str, Any] = {
        "apiVersion": API,
        "kind": "Allocation",
        "id": "alloc-a",
        "tenant": "t",
        "sku": SLICE,
        "gpu_count": 2,
        "region": REGION,
        "requested_at": EPOCH,
        **over,
    }
    state.allocations["alloc-a"] = m.Allocation.model_validate(doc)
    return state


HELD = immutables.held_from(_state(), {"alloc-a"})


@pytest.mark.parametrize(
    ("over", "fields"),
    [
        ({}, []),
        ({"gpu_count": 4}, ["gpu_count"]),
        ({"tenant": "u"}, ["tenant"]),
        ({"region": "r2"}, ["region"]),
        ({"image": "img"}, ["image"]),
        ({"vm_profile": "h200_2g_48c_128g"}, ["vm_profile"]),
        ({"sku": BAREMETAL, "gpu_count": 8}, ["sku", "gpu_count"]),
        ({"state": "released"}, []),  # releasing is how it ends, not an edit
        ({"ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa x"]}, []),
    ],
)
def test_fixed_fields(over: dict[str, Any], fields: list[str]) -> None:
    found = immutables.check(_state(**over), HELD)
    assert {x.code for x in found} <= {p.ALLOCATION_IMMUTABLE}
    assert [x.message.split(":")[0] for x in found] == fields


def test_a_sku_that_changes_its_capacity_shape_under_held_allocations() -> None:
    state = _state()
    sku = state.skus[SLICE]
    state.skus[SLICE] = sku.model_copy(update={"capacity_shape": m.CapacityShape.BAREMETAL})
    found = immutables.check(state, HELD)
    assert [(x.code, x.file) for x in found] == [(p.ALLOCATION_IMMUTABLE, f"Sku/{SLICE}")]
    assert "alloc-a (gpu_slice)" in found[0].message


def test_only_held_allocations_are_checked() -> None:
    assert immutables.check(_state(gpu_count=4), {}) == []
    assert immutables.check(DesiredState(), HELD) == []  # deleted: reported as orphaned elsewhere
