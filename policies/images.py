"""Which image an allocation boots, and whether that image can be placed at all.

Seed 002 §4: the candidate query joins a viable `os_images` row for the SKU,
so a request with no viable image is never placed (the host would only fail
it with `host.image.none`). Viable means: the image exists, is offered to
this request (active, or inactive only since after the request was made),
targets the SKU's capacity shape (`vm_slice` or `baremetal`), is compatible
with the SKU (listed, or a matching vendor when it lists none) and, when its
source is not resolved by MAAS itself, is pinned by a sha256 digest.
"""

from __future__ import annotations

import datetime as dt

from desired import models as m

# Why an image is not viable; the planner's pending details carry one of these.
NONE = "none"  # no image named and no default fits the SKU
UNKNOWN = "unknown"
INACTIVE = "inactive"
WRONG_TARGET = "wrong_target"
INCOMPATIBLE = "incompatible"
NO_DIGEST = "no_digest"


def target(sku: m.Sku) -> str:
    return "baremetal" if sku.capacity_shape is m.CapacityShape.BAREMETAL else "vm_slice"


def fits(image: m.Image, sku: m.Sku) -> bool:
    """Right target, and compatible with the SKU (listed, or the vendor matches when none are listed)."""
    if image.target != target(sku):
        return False
    if image.compatible_skus:
        return sku.sku in image.compatible_skus
    return image.accelerator_vendor in ("any", sku.accelerator_vendor)


def offered(image: m.Image, requested_at: dt.datetime) -> bool:
    """Active, or retired only after this request was made (earlier requests keep their image)."""
    if image.active:
        return True
    if image.inactive_since is None:
        return False
    return _utc(requested_at) < _utc(image.inactive_since)


def default(images: dict[str, m.Image], sku: m.Sku) -> str | None:
    """The image an allocation gets when it names none.

    An active image of the right target that lists this SKU wins (the
    accelerator-specific image the seeds prefer), then one matching the
    vendor; ties go to the lowest slug. Only viable images are candidates.
    """
    listed: list[str] = []
    generic: list[str] = []
    for slug in sorted(images):
        image = images[slug]
        if not image.active or not fits(image, sku) or _missing_digest(image):
            continue
        (listed if image.compatible_skus else generic).append(slug)
    found = listed or generic
    return found[0] if found else None


def unviable(  # noqa: PLR0911
    images: dict[str, m.Image],
    name: str | None,
    sku: m.Sku,
    requested_at: dt.datetime,
) -> str | None:
    """Why image `name` cannot be placed for this request (one of the codes above), or None when it can."""
    if name is None:
        return NONE
    image = images.get(name)
    if image is None:
        return UNKNOWN
    if not offered(image, requested_at):
        return INACTIVE
    if image.target != target(sku):
        return WRONG_TARGET
    if not fits(image, sku):
        return INCOMPATIBLE
    if _missing_digest(image):
        return NO_DIGEST
    return None


def _missing_digest(image: m.Image) -> bool:
    # MAAS aliases are resolved by MAAS itself; every other artifact is pinned by digest.
    return image.immutable_source and not image.digest_sha256


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)
