"""Fabric compatibility (policies.fabric) and VM profile resolution (policies.profiles)."""

from __future__ import annotations

from typing import Any

import pytest

from desired import models as m
from policies import fabric, profiles
from tests.placement import pictures

F = m.Fabric


@pytest.mark.parametrize(
    ("sku", "slot", "ok"),
    [
        (F.INFINIBAND, F.INFINIBAND, True),
        (F.INFINIBAND, F.ROCE, False),  # RoCE is not "InfiniBand-lite"
        (F.ROCE, F.ROCE, True),
        (F.ROCE, F.INFINIBAND, False),  # and InfiniBand is not a RoCE substitute
        (F.ROCE, F.ETHERNET, False),
        (F.ETHERNET, F.ETHERNET, True),
        (F.ETHERNET, F.ROCE, True),  # RoCE NICs carry Ethernet
        (F.ETHERNET, F.INFINIBAND, False),
        (F.NONE, F.INFINIBAND, True),
        (F.NONE, F.NONE, True),
    ],
)
def test_fabric_serves(sku: F, slot: F, ok: bool) -> None:
    assert fabric.fabric_serves(sku, slot) is ok


def _slot(**over: Any) -> m.Slot:
    base: dict[str, Any] = {
        "slot_index": 0,
        "gpu_pci_address": "0000:1b:00.0",
        "gpu_model": "h200",
        "numa_node": 0,
        "slot_group": "numa0",
        "nvme_device": "/dev/disk/by-id/nvme-x",
        "network_fabric": "infiniband",
        "nvme_identity": {"serial": "X1", "size_bytes": 3840755982336},
        "mac_address": "52:54:00:00:00:01",
        "private_ip": "10.100.0.10",
    }
    base.update(over)
    return m.Slot.model_validate(base)


@pytest.mark.parametrize(
    ("sku", "slot", "code"),
    [
        (pictures.SLICE, {}, None),
        (pictures.SLICE, {"network_fabric": "roce"}, fabric.FABRIC_MISMATCH),
        (pictures.SLICE, {"gpu_model": "mi300x"}, fabric.MODEL_MISMATCH),
        (pictures.SLICE, {"capacity_metadata": {"sku": "other-sku"}}, fabric.SKU_PINNED),
        (pictures.SLICE, {"capacity_metadata": {"sku": pictures.SLICE}}, None),
        (pictures.ROCE, {"gpu_model": "mi300x", "network_fabric": "roce"}, None),
        (pictures.ROCE, {"gpu_model": "mi300x"}, fabric.FABRIC_MISMATCH),
    ],
)
def test_slot_mismatch(sku: str, slot: dict[str, Any], code: str | None) -> None:
    got = fabric.slot_mismatch(pictures.skus()[sku], _slot(**slot))
    assert (got.code if got else None) == code


SKU = pictures.skus()[pictures.SLICE]


@pytest.mark.parametrize(
    ("count", "requested", "name", "vcpu", "mem", "derived"),
    [
        (1, None, "h200_1g_24c_64g", 24, 65536, False),  # the SKU default
        (1, "h200_1g_12c_64g", "h200_1g_12c_64g", 12, 65536, False),  # explicit wins over default
        (2, None, "h200_2g_48c_128g", 48, 131072, False),  # defined and derived from the default
        (4, None, "h200_4g_96c_256g", 96, 262144, True),  # scaled from the 1-GPU default
        (2, "h200_1g_12c_64g", "h200_2g_24c_128g", 24, 131072, True),  # scaled from the explicit one
        (8, "h200_1g_12c_64g", "h200_8g_96c_512g", 96, 524288, True),
        (2, "h200_2g_48c_128g", "h200_2g_48c_128g", 48, 131072, False),  # explicit multi-GPU profile
    ],
)
def test_resolve(  # noqa: PLR0917  # one parameter per table column
    count: int, requested: str | None, name: str, vcpu: int, mem: int, derived: bool
) -> None:
    p = profiles.resolve(SKU, count, requested)
    assert isinstance(p, profiles.Profile)
    assert (p.name, p.gpu_count, p.vcpu_count, p.memory_mib, p.derived) == (name, count, vcpu, mem, derived)


@pytest.mark.parametrize(
    ("count", "requested", "code"),
    [
        (1, "nope", profiles.UNKNOWN_PROFILE),
        (4, "h200_2g_48c_128g", profiles.COUNT_MISMATCH),  # only a one-GPU profile scales
    ],
)
def test_resolve_errors(count: int, requested: str, code: str) -> None:
    p = profiles.resolve(SKU, count, requested)
    assert isinstance(p, profiles.ProfileError)
    assert p.code == code


def test_hugepages_are_snapshotted_and_baremetal_has_no_profile() -> None:
    sku = SKU.model_copy(
        update={
            "resource_profile": m.ResourceProfile(
                default_slice_vm_profile="hp",
                slice_vm_profiles={
                    "hp": m.VmProfile(
                        gpu_count=1, vcpu_count=8, memory_mib=4096, hugepages=m.Hugepages(enabled=True, page_size="1G")
                    )
                },
            )
        }
    )
    p = profiles.resolve(sku, 2)
    assert isinstance(p, profiles.Profile)
    assert (p.name, p.hugepages_enabled, p.hugepage_size) == ("hp-x2", True, "1G")
    assert profiles.resolve(pictures.skus()[pictures.BAREMETAL], 8) is None
    no_default = SKU.model_copy(update={"resource_profile": m.ResourceProfile()})
    err = profiles.resolve(no_default, 1)
    assert isinstance(err, profiles.ProfileError)
    assert err.code == profiles.NO_PROFILE
