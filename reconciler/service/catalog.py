"""The portal's catalog: SKUs with prices and VM profiles, and the images each SKU can boot.

Read from the store (the inventory the reconciler applied), in the
service's read-only transaction. Prices are integers in the currency's
minor unit (cents), per GPU-hour, as `Sku.gpu_hourly_price_minor` says; an
offer of n GPUs costs n times that per hour. The status document
(`gpuaas status -o json` and /api/v1/capacity) carries the same prices
(`reconciler.reports.status.priced`), so the portal shows availability and
price from one read.

Images: an image is offered for a SKU when `policies.images` would place it
(right target, compatible, active, digest pinned where required): the list
never shows an image that intake would then refuse.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from desired import models as m
from policies import images as image_rules
from reconciler.reports import status
from reconciler.store import views
from reconciler.store.connections import Connection
from schemas import dberrors


def _typed(conn: Connection) -> tuple[dict[str, m.Sku], dict[str, m.Image]]:
    from psycopg.rows import dict_row

    with dberrors.wrapped("read the catalog"):
        cur = conn.cursor(row_factory=dict_row)
        skus = cur.execute("SELECT * FROM sku_catalog WHERE present ORDER BY sku").fetchall()
        imgs = cur.execute("SELECT * FROM os_images WHERE present ORDER BY slug").fetchall()
    return (
        {r["sku"]: m.Sku.model_validate(views._sku(r)) for r in skus},
        {r["slug"]: m.Image.model_validate(views._image(r)) for r in imgs},
    )


def sku_doc(sku: m.Sku, images: Mapping[str, m.Image]) -> dict[str, Any]:
    rp = sku.resource_profile
    return {
        "sku": sku.sku,
        "display_name": sku.display_name or sku.sku,
        "capacity_shape": sku.capacity_shape.value,
        "accelerator": {"vendor": sku.accelerator_vendor, "model": sku.accelerator_model},
        "network_fabric": str(getattr(sku.network_fabric, "value", sku.network_fabric)),
        "gpu_counts": list(sku.counts),
        "exclusive_node": sku.exclusive_node,
        "vm_profiles": [
            {
                "name": name,
                "gpu_count": p.gpu_count,
                "vcpu_count": p.vcpu_count,
                "memory_mib": p.memory_mib,
                "default": name == rp.default_slice_vm_profile,
            }
            for name, p in sorted(rp.slice_vm_profiles.items())
        ],
        "price": {
            "currency": sku.currency,
            "gpu_hourly_minor": sku.gpu_hourly_price_minor,
            "hourly_minor_by_gpu_count": {str(n): status.price_of(sku, n) for n in sku.counts},
        },
        "default_image": image_rules.default(dict(images), sku),
    }


def skus(conn: Connection) -> dict[str, Any]:
    """The active SKUs a portal may sell."""
    sku_map, image_map = _typed(conn)
    return {"items": [sku_doc(s, image_map) for s in sku_map.values() if s.active]}


def images(conn: Connection, *, sku: str | None) -> dict[str, Any] | None:
    """Active images, with the SKUs each fits; with `sku`, only those it can boot (None: no such SKU)."""
    sku_map, image_map = _typed(conn)
    now = dt.datetime.now(dt.UTC)
    wanted = [sku_map[sku]] if sku is not None and sku in sku_map else list(sku_map.values())
    if sku is not None and sku not in sku_map:
        return None
    out = []
    for slug, image in image_map.items():
        fits = [s.sku for s in wanted if image_rules.unviable(image_map, slug, s, now) is None]
        if image.active and fits:
            out.append(
                {
                    "slug": slug,
                    "display_name": image.display_name or slug,
                    "version": image.version,
                    "family": image.family,
                    "architecture": image.architecture,
                    "target": image.target,
                    "default_username": image.default_username,
                    "skus": fits,
                }
            )
    return {"items": out}
