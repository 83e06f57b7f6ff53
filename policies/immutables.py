"""What an allocation holding claims may not change: its sale is fixed once it holds hardware.

Seed 000: a change of GPU count needs "an explicit resize or repair state
transition, not silent billing drift". Once an allocation holds claims, its
tenant, SKU, region, GPU count, capacity shape, image and VM profile are what
was placed, provisioned and billed; an edit of any of them is refused
(`desired.allocation.immutable`) at the file, line and field, and the revision
is not applied. A resize is a release (`state: released`) and a new request
(a new allocation id), never an edit.

`check(state, held)` is pure: `held` is what the caller knows was placed,
read from the store (`gpuaas apply`, `gpuaas run`) or from the base revision
(`gpuaas plan`: head against base).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass

from desired import models as m
from desired import problems as p
from desired.state import DesiredState

FIELDS = ("tenant", "sku", "region", "gpu_count", "image", "vm_profile")
LISTED = 10  # allocations a capacity-shape problem names; the rest are counted


@dataclass(frozen=True, slots=True)
class Held:
    """The sale of one allocation that holds claims, as it was placed."""

    tenant: str
    sku: str
    region: str
    gpu_count: int
    image: str | None
    vm_profile: str | None
    capacity_shape: str | None  # "baremetal" | "gpu_slice"; None when not known


def held_from(state: DesiredState, ids: Set[str]) -> dict[str, Held]:
    """What `state` declares for the allocations `ids` (those that hold claims), to compare a later state with."""
    out: dict[str, Held] = {}
    for aid in sorted(ids):
        alloc = state.allocations.get(aid)
        if alloc is None:
            continue
        sku = state.skus.get(alloc.sku)
        out[aid] = Held(
            alloc.tenant,
            alloc.sku,
            alloc.region,
            alloc.gpu_count,
            alloc.image,
            alloc.vm_profile,
            sku.capacity_shape.value if sku is not None else None,
        )
    return out


def check(state: DesiredState, held: Mapping[str, Held]) -> list[p.Problem]:
    """Every edit of a held allocation's fixed fields in `state`, at its file, line and field."""
    out: list[p.Problem] = []
    shapes: dict[str, list[tuple[str, str]]] = {}  # sku -> (allocation, shape it was placed as)
    for aid in sorted(held.keys() & state.allocations.keys()):
        was, alloc = held[aid], state.allocations[aid]
        out.extend(_fields(state, aid, was, alloc))
        sku = state.skus.get(alloc.sku)
        if (
            alloc.sku == was.sku
            and sku is not None
            and was.capacity_shape is not None
            and sku.capacity_shape.value != was.capacity_shape
        ):
            shapes.setdefault(sku.sku, []).append((aid, was.capacity_shape))
    for name, allocs in sorted(shapes.items()):
        out.append(_shape(state, name, allocs))
    return out


def _fields(state: DesiredState, aid: str, was: Held, alloc: m.Allocation) -> Iterator[p.Problem]:
    for name in FIELDS:
        before, now = getattr(was, name), getattr(alloc, name)
        if before == now:
            continue
        how = (
            "a resize is a release (state: released) and a new request with a new id, never an edit"
            if name == "gpu_count"
            else "release it (state: released) and request a new allocation instead"
        )
        message = (
            f"allocation {aid} holds claims: {name} is fixed at {_show(before)}, not {_show(now)}; "
            f"{how}. The revision is not applied; the last valid one stays in force"
        )
        yield _at(state, "Allocation", aid, name, message)


def _shape(state: DesiredState, sku: str, allocs: list[tuple[str, str]]) -> p.Problem:
    names = ", ".join(f"{aid} ({shape})" for aid, shape in allocs[:LISTED])
    more = f" and {len(allocs) - LISTED} more" if len(allocs) > LISTED else ""
    now = state.skus[sku].capacity_shape.value
    message = (
        f"SKU {sku} changes its capacity shape to {now} while {len(allocs)} allocation(s) placed as "
        f"another shape hold claims: {names}{more}; release them first. The revision is not applied"
    )
    return _at(state, "Sku", sku, "capacity_shape", message)


def _at(state: DesiredState, kind: str, name: str, field: str, message: str) -> p.Problem:
    src = state.sources.get((kind, name))
    if src is None:  # a state built without documents (the store's own inventory)
        return p.Problem(p.ALLOCATION_IMMUTABLE, f"{field}: {message}", f"{kind}/{name}")
    return src.at(field, code=p.ALLOCATION_IMMUTABLE, message=f"{field}: {message}")


def _show(value: object) -> str:
    return "none" if value is None else str(value)
