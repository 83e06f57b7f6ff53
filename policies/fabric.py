"""Fabric and accelerator compatibility between a SKU and a slot.

Seed 000: an InfiniBand product needs slots whose validated fabric is
InfiniBand; an AMD/RoCE product needs RoCE slots, validated on their own
path. RoCE is its own capability, never "InfiniBand missing", so a RoCE
slot never serves an InfiniBand SKU and the reverse. Products that promise
only Ethernet (or no fabric) may use any slot whose fabric carries Ethernet
(Ethernet or RoCE) or, for `none`, any slot at all.

A slot may also pin itself to one SKU (`capacity_metadata.sku`), and its GPU
model must be the SKU's accelerator model.
"""

from __future__ import annotations

from dataclasses import dataclass

from desired import models as m
from policies import codes as policies_codes

# Stable reason codes. Do not change the string values.
FABRIC_MISMATCH = policies_codes.SLOT_FABRIC_MISMATCH
MODEL_MISMATCH = policies_codes.SLOT_MODEL_MISMATCH
SKU_PINNED = policies_codes.SLOT_PINNED_TO_OTHER_SKU

_SERVES: dict[m.Fabric, frozenset[m.Fabric]] = {
    m.Fabric.INFINIBAND: frozenset({m.Fabric.INFINIBAND}),
    m.Fabric.ROCE: frozenset({m.Fabric.ROCE}),
    m.Fabric.ETHERNET: frozenset({m.Fabric.ETHERNET, m.Fabric.ROCE}),
    m.Fabric.NONE: frozenset(m.Fabric),
}


def fabric_serves(sku_fabric: m.Fabric, slot_fabric: m.Fabric) -> bool:
    """May a slot with `slot_fabric` carry a product that promises `sku_fabric`?"""
    return slot_fabric in _SERVES[sku_fabric]


@dataclass(frozen=True, slots=True)
class Mismatch:
    code: str
    message: str


def slot_mismatch(sku: m.Sku, slot: m.Slot) -> Mismatch | None:
    """Why this slot cannot carry this SKU, or None when it can."""
    return mismatch(sku, slot.gpu_model, slot.network_fabric, slot.capacity_metadata.sku)


def mismatch(sku: m.Sku, gpu_model: str, network_fabric: m.Fabric, pinned: str | None) -> Mismatch | None:
    """`slot_mismatch` from the three slot fields it reads (the planner's slot facts keep no model)."""
    if gpu_model != sku.accelerator_model:
        return Mismatch(MODEL_MISMATCH, f"slot GPU is {gpu_model}, SKU {sku.sku} sells {sku.accelerator_model}")
    if not fabric_serves(sku.network_fabric, network_fabric):
        return Mismatch(
            FABRIC_MISMATCH, f"slot fabric is {network_fabric.value}, SKU {sku.sku} needs {sku.network_fabric.value}"
        )
    if pinned is not None and pinned != sku.sku:
        return Mismatch(SKU_PINNED, f"slot is reserved for SKU {pinned}")
    return None
