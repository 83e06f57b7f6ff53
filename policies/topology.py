"""Topology fit per GPU count: which slot sets of one node may carry a slice.

A node's sellable slots form a small tree: NUMA slot groups, optional PCIe
pairs inside a group, slots. Free slots are a bitmask over *positions* (the
node's slots in slot_index order), so the packing index can memoise every
answer per (layout, free mask).

Seeds 000/001 and the SKU's `topology_policy` decide what a count needs:

- `any_healthy_slot`: any free slots (1 GPU: any slot);
- `numa_aligned_preferred`: inside one NUMA group when the node has such a
  set, otherwise any free slots of the node;
- `numa_aligned_required`: inside one NUMA group (4 GPUs: a whole 4-slot group);
- `full_host_slot_group_required`: every slot of the host, all free (8 GPUs).

Each candidate set carries a tier: 0 = one group and whole PCIe pairs (the
aligned shape), 1 = one group but a split pair, 2 = spans groups.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from desired.models import TopologyRule

TIER_ALIGNED = 0
TIER_GROUP = 1
TIER_SPREAD = 2

# Above this many free slots, spread sets are not enumerated exhaustively
# (C(16, 8) is already 12,870); the lowest positions stand in for them.
_MAX_ENUMERATED = 16


@dataclass(frozen=True, slots=True)
class Layout:
    """The sellable slots of one node: groups of PCIe units of positions.

    Build with `layout()`; the masks are derived once so fit checks are bit
    operations.
    """

    groups: tuple[tuple[tuple[int, ...], ...], ...]
    full: int
    size: int
    group_masks: tuple[int, ...]
    unit_masks: tuple[tuple[int, ...], ...]


def layout(groups: Iterable[Iterable[Iterable[int]]]) -> Layout:
    """Normalise groups -> units -> positions (sorted, so equal shapes compare equal)."""
    norm = tuple(sorted(tuple(sorted(tuple(sorted(unit)) for unit in group)) for group in groups))
    norm = tuple(g for g in norm if g)
    positions = [p for g in norm for u in g for p in u]
    if len(positions) != len(set(positions)):
        raise ValueError("a slot position appears in two units")
    unit_masks = tuple(tuple(_mask(u) for u in g) for g in norm)
    group_masks = tuple(_mask(p for u in g for p in u) for g in norm)
    return Layout(norm, _mask(positions), len(positions), group_masks, unit_masks)


def layout_of(slots: Sequence[tuple[str, str | None]]) -> Layout:
    """Layout from (slot_group, pcie_pair) per position, positions in order."""
    groups: dict[str, dict[str, list[int]]] = {}
    for pos, (group, pair) in enumerate(slots):
        unit = pair if pair is not None else f"\0{pos}"
        groups.setdefault(group, {}).setdefault(unit, []).append(pos)
    return layout(g.values() for g in groups.values())


@dataclass(frozen=True, slots=True)
class Choice:
    """One topology-safe slot set: a mask of positions, its tier and spread."""

    mask: int
    tier: int
    groups_used: int

    @property
    def positions(self) -> tuple[int, ...]:
        return positions(self.mask)


def _mask(positions: Iterable[int]) -> int:
    out = 0
    for p in positions:
        out |= 1 << p
    return out


@functools.lru_cache(maxsize=4096)
def positions(mask: int) -> tuple[int, ...]:
    """Set bit positions of `mask`, lowest first (memoised: masks repeat endlessly)."""
    out = []
    p = 0
    while mask:
        if mask & 1:
            out.append(p)
        mask >>= 1
        p += 1
    return tuple(out)


def popcount(mask: int) -> int:
    return mask.bit_count()


def _in_group(lay: Layout, free: int, g: int) -> list[Choice]:
    out: list[Choice] = []
    for gi, gmask in enumerate(lay.group_masks):
        avail = positions(free & gmask)
        if len(avail) < g:
            continue
        units = lay.unit_masks[gi]
        for combo in itertools.combinations(avail, g):
            m = _mask(combo)
            whole = all((m & u) in (0, u) for u in units)
            out.append(Choice(m, TIER_ALIGNED if whole else TIER_GROUP, 1))
    return out


def _spread(lay: Layout, free: int, g: int) -> list[Choice]:
    avail = positions(free & lay.full)
    if len(avail) < g:
        return []
    combos: Iterable[tuple[int, ...]]
    combos = [tuple(avail[:g])] if len(avail) > _MAX_ENUMERATED else itertools.combinations(avail, g)
    out = []
    for combo in combos:
        m = _mask(combo)
        used = sum(1 for gm in lay.group_masks if m & gm)
        if used > 1:
            out.append(Choice(m, TIER_SPREAD, used))
    return out


def choices(lay: Layout, free: int, g: int, rule: TopologyRule) -> tuple[Choice, ...]:
    """Every topology-safe set of `g` free slots on this node under `rule`."""
    free &= lay.full
    if g <= 0 or popcount(free) < g:
        return ()
    if rule is TopologyRule.FULL_HOST_SLOT_GROUP_REQUIRED:
        if g == lay.size and free == lay.full:
            return (Choice(free, TIER_ALIGNED, len(lay.groups)),)
        return ()
    inside = _in_group(lay, free, g)
    if rule is TopologyRule.NUMA_ALIGNED_REQUIRED:
        return tuple(inside)
    if rule is TopologyRule.NUMA_ALIGNED_PREFERRED and inside:
        return tuple(inside)
    return tuple(inside + _spread(lay, free, g))


def fits(lay: Layout, free: int, g: int, rule: TopologyRule) -> bool:
    return max_disjoint(lay, free, g, rule) > 0


def max_disjoint(lay: Layout, free: int, g: int, rule: TopologyRule) -> int:
    """How many disjoint `g`-slot sets the free slots could still carry."""
    free &= lay.full
    if g <= 0:
        return 0
    if rule is TopologyRule.FULL_HOST_SLOT_GROUP_REQUIRED:
        return 1 if g == lay.size and free == lay.full else 0
    if rule is TopologyRule.NUMA_ALIGNED_REQUIRED:
        return sum(popcount(free & gm) // g for gm in lay.group_masks)
    # Preferred and any: in-group sets first, then whatever spans groups.
    return popcount(free) // g


def stranded(lay: Layout, free: int, g: int, rule: TopologyRule) -> int:
    """Free GPUs that no `g`-GPU request could use: free - g * max_disjoint."""
    return popcount(free & lay.full) - g * max_disjoint(lay, free, g, rule)


def signature(lay: Layout, free: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Canonical free pattern: equal signatures are the same shape up to symmetry.

    Per group, the sorted (unit size, free slots in unit) pairs; groups sorted.
    Every score in `policies.packing` except slot-index tie-breaks depends
    only on the signature, which is why the index buckets nodes by it.
    """
    return tuple(sorted(tuple(sorted((popcount(u), popcount(free & u)) for u in units)) for units in lay.unit_masks))
