"""Typed documents share equal strings, field sets and small sub-models (desired.models.compact).

Sharing must never be visible: a compacted model equals, dumps and reads
exactly as the model pydantic made, also after another model is copied.
"""

from __future__ import annotations

from typing import Any

from desired import models as m
from desired.reading.loading import parse_files


def _slot_map(node: str, wipe: str = "wipefs-blkdiscard-verify") -> bytes:
    slots = "".join(
        f"""
- slot_index: {i}
  gpu_pci_address: '0000:1{i}:00.0'
  gpu_model: h200
  numa_node: 0
  slot_group: numa0
  nvme_device: /dev/disk/by-id/nvme-{node}-{i}
  network_fabric: infiniband
  mac_address: '52:54:00:00:{node[-2:]}:0{i}'
  private_ip: 10.100.0.1{i}
  capacity_metadata:
    storage_ownership: slice
    destructive_wipe_policy: {wipe}
"""
        for i in range(2)
    )
    return f"apiVersion: gpuaas.io/v1alpha1\nkind: SlotMap\nnode: {node}\nslots:{slots}".encode()


def _load(*files: tuple[str, bytes]) -> dict[str, m.SlotMap]:
    result = parse_files(list(files), workers=1)
    assert result.problems == []
    return result.state.slot_maps


def _plain(node: str) -> dict[str, Any]:
    import yaml

    value = yaml.safe_load(_slot_map(node))
    assert isinstance(value, dict)
    return value


def test_compacted_models_equal_and_dump_as_pydantic_made_them() -> None:
    maps = _load(("a.yaml", _slot_map("node-01")), ("b.yaml", _slot_map("node-02")))
    for node, loaded in maps.items():
        fresh = m.SlotMap.model_validate(_plain(node))
        assert loaded == fresh
        assert loaded.model_dump(exclude_unset=True) == fresh.model_dump(exclude_unset=True)
        assert loaded.model_fields_set == fresh.model_fields_set


def test_equal_values_are_one_object_across_documents() -> None:
    maps = _load(("a.yaml", _slot_map("node-01")), ("b.yaml", _slot_map("node-02")))
    a, b = maps["node-01"].slots[0], maps["node-02"].slots[0]
    assert a.gpu_model is b.gpu_model
    assert a.gpu_pci_address is b.gpu_pci_address
    assert a.capacity_metadata is b.capacity_metadata
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert a.mac_address != b.mac_address  # unique per slot: kept apart


def test_different_sub_models_stay_apart() -> None:
    maps = _load(("a.yaml", _slot_map("node-01")), ("b.yaml", _slot_map("node-02", wipe="none")))
    assert maps["node-01"].slots[0].capacity_metadata.destructive_wipe_policy == "wipefs-blkdiscard-verify"
    assert maps["node-02"].slots[0].capacity_metadata.destructive_wipe_policy == "none"


def test_copy_with_update_leaves_shared_field_sets_alone() -> None:
    maps = _load(("a.yaml", _slot_map("node-01")), ("b.yaml", _slot_map("node-02")))
    slot = maps["node-01"].slots[0]
    before = set(slot.model_fields_set)
    copied = slot.model_copy(update={"vcpu_count": 4})
    assert "vcpu_count" in copied.model_fields_set
    assert maps["node-02"].slots[0].model_fields_set == before
    assert slot.model_fields_set == before
