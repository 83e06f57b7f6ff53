"""A readiness timeout per SKU or VM profile: most specific wins (VM profile > SKU > Fleet).

The SKU / VM profile value is resolved at placement into the claim's profile
snapshot (so a later SKU edit changes no running VM), carried into the host
plan per VM, and the Fleet's value fills in where neither is set. Range and
shape errors are file:line cases under broken/ (sku_*readiness_timeout*).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from desired import models as m
from gpuaas_tools.bench import synthetic
from policies import profiles
from reconciler.reconcile import reconciling
from reconciler.store import connections, hostplans
from schemas import hostplans as hp
from schemas import snapshots

FLEET_S = 300


def _sku(sku_timeout: int | None, one: int | None, two: int | None) -> m.Sku:
    def vm(gpus: int, timeout: int | None, **more: Any) -> dict[str, Any]:
        doc: dict[str, Any] = {"gpu_count": gpus, "vcpu_count": 24 * gpus, "memory_mib": 65536 * gpus, **more}
        return doc | ({"readiness_timeout_seconds": timeout} if timeout is not None else {})

    doc: dict[str, Any] = {
        "apiVersion": m.API_VERSION,
        "kind": "Sku",
        "sku": "s",
        "capacity_shape": "gpu_slice",
        "accelerator_vendor": "nvidia",
        "accelerator_model": "h200",
        "allowed_gpu_counts": [1, 2, 4],
        "network_fabric": "infiniband",
        "gpu_hourly_price_minor": 1,
        "resource_profile": {
            "default_slice_vm_profile": "p_1g",
            "slice_vm_profiles": {"p_1g": vm(1, one), "p_2g": vm(2, two, derived_from="p_1g")},
        },
    }
    if sku_timeout is not None:
        doc["readiness_timeout_seconds"] = sku_timeout
    return m.Sku.model_validate(doc)


def _effective(sku: m.Sku, gpus: int) -> int:
    profile = profiles.resolve(sku, gpus)
    assert isinstance(profile, profiles.Profile)
    vm = hp.VmSpec(
        allocation_id="a",
        tenant="t",
        bundles=(),
        vcpu_count=1,
        memory_mib=512,
        readiness_timeout_s=profile.readiness_timeout_s,
    )
    plan = hp.HostPlan(
        node="n",
        generation=1,
        network=hp.Network("10.0.0.0/24", "10.0.0.1", "", "", "br"),
        os_disk="/dev/x",
        readiness_timeout_s=FLEET_S,
        vms=(vm,),
    )
    return hp.readiness_timeout(plan, vm)


@pytest.mark.parametrize(
    ("sku_s", "one_s", "two_s", "gpus", "want"),
    [
        (None, None, None, 1, FLEET_S),  # nothing set: the Fleet's
        (600, None, None, 1, 600),  # the SKU's over the Fleet's
        (600, 45, None, 1, 45),  # the VM profile's over the SKU's
        (None, 45, None, 1, 45),
        (600, 45, 120, 2, 120),  # a profile defined for 2 GPUs: its own value
        (600, 45, None, 2, 600),  # ... or, unset, the SKU's (not its base profile's)
        (600, 45, None, 4, 45),  # scaled from p_1g (no 4-GPU profile): the base profile's
        (None, None, 120, 4, FLEET_S),
    ],
)
def test_the_most_specific_timeout_wins(
    sku_s: int | None, one_s: int | None, two_s: int | None, gpus: int, want: int
) -> None:
    assert _effective(_sku(sku_s, one_s, two_s), gpus) == want


def test_an_unset_timeout_leaves_the_snapshot_and_the_plan_as_they_were() -> None:
    profile = profiles.resolve(_sku(None, None, None), 1)
    assert isinstance(profile, profiles.Profile) and profile.readiness_timeout_s is None
    assert "readiness_timeout_s" not in (snapshots.profile_to_json(profile) or {})
    vm = hp.VmSpec(allocation_id="a", tenant="t", bundles=(), vcpu_count=1, memory_mib=512)
    plan = hp.HostPlan(
        node="n", generation=1, network=hp.Network("10.0.0.0/24", "10.0.0.1", "", "", "br"), os_disk="/dev/x", vms=(vm,)
    )
    assert "readiness_timeout_s" not in hp.to_json(plan)["vms"][0]
    assert (
        hp.from_json(hp.to_json(dataclasses.replace(plan, vms=(dataclasses.replace(vm, readiness_timeout_s=45),))))
        .vms[0]
        .readiness_timeout_s
        == 45
    )


def test_the_host_plan_carries_the_sku_timeout_and_an_edit_changes_no_running_vm(db_url: str) -> None:
    state = synthetic.fleet(nodes=1, allocations=1, baremetal_nodes=0, baremetal_allocations=0)
    sku = state.skus[synthetic.SLICE_SKU]
    state.skus[synthetic.SLICE_SKU] = m.Sku.model_validate(
        {**sku.model_dump(by_alias=True), "readiness_timeout_seconds": 600}
    )
    with connections.connect(db_url, autocommit=True) as conn:
        reconciling.reconcile(conn, state)
        plan = hostplans.read(conn, "node-00000")
        assert plan is not None and plan.readiness_timeout_s == 300  # the Fleet's, for VMs without their own
        assert [v.readiness_timeout_s for v in plan.vms] == [600]
        assert hp.readiness_timeout(plan, plan.vms[0]) == 600

        # A later SKU edit: the placed VM keeps its snapshot.
        state.skus[synthetic.SLICE_SKU] = m.Sku.model_validate(
            {**sku.model_dump(by_alias=True), "readiness_timeout_seconds": 45}
        )
        reconciling.reconcile(conn, state)
        again = hostplans.read(conn, "node-00000")
    assert again is not None and [v.readiness_timeout_s for v in again.vms] == [600]
