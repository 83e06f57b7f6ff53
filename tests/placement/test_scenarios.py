"""Placement stories, one ASCII topology each (see tests/placement/pictures.py).

Legend: '.' free, a-z slot claims of existing allocations, A-Z baremetal
claims, '#' failed, '~' cleanup, '!' cleanup blocked, '-' not approvable.
Groups are separated by '|'; consecutive slots in a group are PCIe pairs.
"""

from __future__ import annotations

import pytest

from reconciler import plans
from reconciler.placement import reasons
from tests.placement.pictures import BAREMETAL, ROCE, SLICE, world

# ------------------------------------------------------------- GPU counts


def test_one_gpu_fills_a_fragmented_group_before_a_clean_one() -> None:
    """
    n1: [....|abc.]
    n2: [....|....]
    The free slot 7 of n1 takes it: numa0 stays whole for a 4-GPU slice and
    n2 stays clean for a baremetal lease.
    """
    w = world(test_one_gpu_fills_a_fragmented_group_before_a_clean_one.__doc__)
    assert w.place(SLICE, 1) == ("n1", (7,))
    # first-fit, for contrast, breaks the clean group
    assert world(test_one_gpu_fills_a_fragmented_group_before_a_clean_one.__doc__).place(
        SLICE, 1, policy="first-fit"
    ) == ("n1", (0,))


def test_two_gpus_take_an_aligned_pair_in_a_used_group() -> None:
    """
    n1: [a...|....]
    Slots 2-3 form a whole PCIe pair next to the claimed slot 0; numa1 stays whole.
    """
    assert world(test_two_gpus_take_an_aligned_pair_in_a_used_group.__doc__).place(SLICE, 2) == ("n1", (2, 3))


def test_two_gpus_span_groups_only_when_no_group_has_two() -> None:
    """
    n1: [abc.|def.]
    numa_aligned_preferred: no group has two free slots, so 3 and 7.
    """
    assert world(test_two_gpus_span_groups_only_when_no_group_has_two.__doc__).place(SLICE, 2) == ("n1", (3, 7))


def test_two_gpus_required_alignment_never_spans_groups() -> None:
    """
    r1: [abc.|def.] roce
    The RoCE SKU requires NUMA alignment for 2 GPUs: 2 free GPUs, no safe pair.
    """
    w = world(test_two_gpus_required_alignment_never_spans_groups.__doc__)
    assert w.place(ROCE, 2) == reasons.TOPOLOGY
    pending = w.plan().pending[-1]
    assert pending.details["free_gpus"] == 2
    assert pending.details["nodes_with_free"] == 1
    assert "2 free GPU(s) on 1 node(s)" in pending.message


def test_four_gpus_take_a_whole_numa_group() -> None:
    """
    n1: [a...|b...]
    n2: [cc..|....]
    n1 has six free GPUs but no whole group; n2's numa1 is whole.
    """
    assert world(test_four_gpus_take_a_whole_numa_group.__doc__).place(SLICE, 4) == ("n2", (4, 5, 6, 7))


def test_four_gpus_with_capacity_but_no_group_is_a_topology_refusal() -> None:
    """
    n1: [a...|b...]
    n2: [c...|d...]
    Twelve free GPUs, none of them in a whole group.
    """
    w = world(test_four_gpus_with_capacity_but_no_group_is_a_topology_refusal.__doc__)
    assert w.place(SLICE, 4) == reasons.TOPOLOGY
    assert "12 free GPU(s) on 2 node(s)" in w.plan().pending[-1].message


def test_eight_gpus_take_every_slot_of_a_clean_host() -> None:
    """
    n1: [a...|....]
    n2: [....|....]
    """
    assert world(test_eight_gpus_take_every_slot_of_a_clean_host.__doc__).place(SLICE, 8) == (
        "n2",
        (0, 1, 2, 3, 4, 5, 6, 7),
    )


def test_eight_gpus_never_on_a_host_with_a_failed_slot() -> None:
    """
    n1: [....|...#]
    Seven sellable GPUs; a full-host slice needs every slot of the host.
    """
    assert world(test_eight_gpus_never_on_a_host_with_a_failed_slot.__doc__).place(SLICE, 8) == reasons.CAPACITY


def test_failed_slot_is_never_placed_and_counts_as_fragmentation() -> None:
    """
    n1: [...#|....]
    One GPU goes to numa0 (already unable to take a 4), not into clean numa1.
    """
    got = world(test_failed_slot_is_never_placed_and_counts_as_fragmentation.__doc__).place(SLICE, 1)
    assert got in {("n1", (0,)), ("n1", (1,)), ("n1", (2,))}


# ------------------------------------------------------ baremetal and slices


def test_baremetal_needs_a_node_without_any_claim() -> None:
    """
    n1: [a...|....]
    n2: [~...|....]
    n3: [....|....]
    n1 holds a slice and n2 waits for cleanup proof: only n3 can be leased.
    """
    w = world(test_baremetal_needs_a_node_without_any_claim.__doc__)
    assert w.place(BAREMETAL, 8) == ("n3", (0, 1, 2, 3, 4, 5, 6, 7))
    assert w.place(BAREMETAL, 8) == reasons.NO_EMPTY_NODE


def test_baremetal_blocks_every_slot_while_it_lives() -> None:
    """
    n1: [AAAA|AAAA]
    n2: [bbbb|bbb.]
    """
    w = world(test_baremetal_blocks_every_slot_while_it_lives.__doc__)
    assert w.place(SLICE, 1) == ("n2", (7,))
    assert w.place(SLICE, 1) == reasons.CAPACITY


def test_baremetal_prefers_hosts_that_cannot_serve_slices() -> None:
    """
    n1: [....|....]
    b1: [] bm-only
    """
    assert world(test_baremetal_prefers_hosts_that_cannot_serve_slices.__doc__).place(BAREMETAL, 8) == ("b1", ())


def test_slices_fill_nodes_in_slice_use_before_opening_a_clean_one() -> None:
    """
    n1: [....|....]
    n2: [....|....]
    n3: [a...|....]
    Four one-GPU slices in a row all land on n3; n1 and n2 stay whole.
    """
    w = world(test_slices_fill_nodes_in_slice_use_before_opening_a_clean_one.__doc__)
    for _ in range(4):
        w.request(SLICE, 1)
    result = w.plan()
    assert {p.node for p in result.placements} == {"n3"}
    assert sorted(s for p in result.placements for s in p.slot_indexes) == [1, 2, 3, 4]


def test_mixed_plan_orders_by_request_time() -> None:
    """
    n1: [....|....]
    n2: [....|....]
    The slice asked first takes n1; the baremetal lease then takes n2; a
    second baremetal lease finds no empty node.
    """
    w = world(test_mixed_plan_orders_by_request_time.__doc__)
    first = w.request(SLICE, 2)
    bm = w.request(BAREMETAL, 8)
    late = w.request(BAREMETAL, 8)
    result = w.plan()
    placed = {p.allocation_id: p for p in result.placements}
    assert placed[first].node == "n1"
    assert placed[bm].node == "n2"
    assert placed[bm].capacity_shape == "baremetal"
    assert placed[bm].profile is None
    assert [(p.allocation_id, p.code) for p in result.pending] == [(late, reasons.NO_EMPTY_NODE)]


# ---------------------------------------------------- draining and health


def test_draining_nodes_take_nothing_new() -> None:
    """
    n1: [a...|....] draining
    n2: [....|....] draining
    """
    w = world(test_draining_nodes_take_nothing_new.__doc__)
    assert w.place(SLICE, 1) == reasons.DRAINING
    assert w.place(BAREMETAL, 8) == reasons.DRAINING


def test_draining_node_is_skipped_for_an_active_one() -> None:
    """
    n1: [abc.|defg] draining
    n2: [....|....]
    """
    assert world(test_draining_node_is_skipped_for_an_active_one.__doc__).place(SLICE, 1) == ("n2", (0,))


@pytest.mark.parametrize(("word", "code"), [("maintenance", reasons.MAINTENANCE), ("unhealthy", reasons.UNHEALTHY)])
def test_maintenance_and_unhealthy_nodes(word: str, code: str) -> None:
    w = world(f"n1: [....|....] {word}")
    assert w.place(SLICE, 1) == code


def test_cleanup_blocked_slot_blocks_only_itself() -> None:
    """
    n1: [!...|....]
    The blocked slot is never sold; the node still serves slices, not baremetal.
    """
    w = world(test_cleanup_blocked_slot_blocks_only_itself.__doc__)
    assert w.place(SLICE, 1) == ("n1", (1,))
    assert w.place(BAREMETAL, 8) == reasons.NO_EMPTY_NODE


# ------------------------------------------------------- tenant boundary


def test_tenant_boundary() -> None:
    """
    n1: [....|....] org=acme
    n2: [....|....] org=acme
    """
    w = world(test_tenant_boundary.__doc__)
    assert w.place(SLICE, 1, tenant="acme")[0] in {"n1", "n2"}
    assert w.place(SLICE, 1, tenant="globex") == reasons.TENANT_BOUNDARY
    assert w.place(BAREMETAL, 8, tenant="globex") == reasons.TENANT_BOUNDARY


def test_shared_nodes_serve_every_tenant_and_dedicated_ones_only_theirs() -> None:
    """
    n1: [abcd|efg.] org=acme
    n2: [....|....]
    """
    w = world(test_shared_nodes_serve_every_tenant_and_dedicated_ones_only_theirs.__doc__)
    assert w.place(SLICE, 1, tenant="acme") == ("n1", (7,))
    assert w.place(SLICE, 1, tenant="globex") == ("n2", (0,))


# ----------------------------------------------------------------- fabric


def test_roce_sku_goes_to_roce_slots_and_never_to_infiniband() -> None:
    """
    ib1: [....|....]
    rc1: [....|....] roce
    """
    w = world(test_roce_sku_goes_to_roce_slots_and_never_to_infiniband.__doc__)
    assert w.place(ROCE, 4) == ("rc1", (0, 1, 2, 3))
    assert w.place(SLICE, 4) == ("ib1", (0, 1, 2, 3))


def test_infiniband_sku_with_only_roce_hosts_is_a_fabric_refusal() -> None:
    """
    rc1: [....|....] roce
    rc2: [....|....] roce
    """
    w = world(test_infiniband_sku_with_only_roce_hosts_is_a_fabric_refusal.__doc__)
    w.desired.skus[SLICE] = w.desired.skus[SLICE].model_copy(update={"accelerator_model": "mi300x"})
    assert w.place(SLICE, 1) == reasons.FABRIC
    assert "needs infiniband" in w.plan().pending[-1].message


def test_roce_sku_without_roce_hosts_has_no_node() -> None:
    """
    ib1: [....|....]
    """
    assert world(test_roce_sku_without_roce_hosts_has_no_node.__doc__).place(ROCE, 1) == reasons.NO_NODE


# ------------------------------------------------------------ readiness


@pytest.mark.parametrize("word", ["notag", "fw-off", "share"])
def test_slice_capability_needs_tag_firmware_and_slice_storage(word: str) -> None:
    w = world(f"n1: [....|....] {word}")
    assert w.place(SLICE, 1) == reasons.NOT_SLICE_READY


def test_slots_without_per_slot_vf_make_no_slice_host() -> None:
    """
    c1: [----|----]
    """
    w = world(test_slots_without_per_slot_vf_make_no_slice_host.__doc__)
    assert w.place(SLICE, 1) == reasons.NOT_SLICE_READY
    assert w.place(BAREMETAL, 8) == ("c1", (0, 1, 2, 3, 4, 5, 6, 7))


# ------------------------------------------------------- request errors


@pytest.mark.parametrize(
    ("sku", "gpus", "code"),
    [
        ("no-such-sku", 1, reasons.SKU_UNKNOWN),
        (SLICE, 3, reasons.GPU_COUNT),
        (ROCE, 8, reasons.GPU_COUNT),
    ],
)
def test_request_errors(sku: str, gpus: int, code: str) -> None:
    assert world("n1: [....|....]").place(sku, gpus) == code


def test_unknown_region_has_no_node() -> None:
    assert world("n1: [....|....]").place(SLICE, 1, region="mars-1") == reasons.NO_NODE


def test_unknown_vm_profile_is_pending_with_a_profile_code() -> None:
    assert world("n1: [....|....]").place(SLICE, 1, vm_profile="nope") == "plan.profile.unknown"


def test_host_reported_firmware_readiness_overrides_onboarding_evidence() -> None:
    """
    n1: [....|....] fw-off
    n2: [....|....]
    """
    w = world(test_host_reported_firmware_readiness_overrides_onboarding_evidence.__doc__)
    w.observed = plans.Observed(firmware_ready={"n1": True, "n2": False})
    assert w.place(SLICE, 1) == ("n1", (0,))
