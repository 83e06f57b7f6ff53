"""Topology fit per GPU count (policies.topology), one table per rule.

Layout used throughout, an H200 host::

    numa0: (0 1)(2 3)    numa1: (4 5)(6 7)

Free masks are written as 8 characters, slot 0 first: '.' free, 'x' taken.
"""

from __future__ import annotations

import pytest

from desired.models import TopologyRule as R
from policies import topology as t

H200 = t.layout_of([(f"numa{s // 4}", f"pair{s // 2}") for s in range(8)])


def free(picture: str) -> int:
    return sum(1 << i for i, ch in enumerate(picture.replace("|", "")) if ch == ".")


def slots(mask: int) -> str:
    return "".join(str(p) for p in t.positions(mask))


@pytest.mark.parametrize(
    ("picture", "g", "rule", "expected"),
    [
        # 1 GPU: any free slot, each one its own aligned choice
        ("xxxx|xxx.", 1, R.ANY_HEALTHY_SLOT, {"7"}),
        ("xxxx|xxxx", 1, R.ANY_HEALTHY_SLOT, set()),
        # 2 GPUs, preferred: inside a group when the node has such a pair ...
        ("x.x.|xx..", 2, R.NUMA_ALIGNED_PREFERRED, {"13", "67"}),
        # ... otherwise any two free slots across groups
        ("xxx.|xxx.", 2, R.NUMA_ALIGNED_PREFERRED, {"37"}),
        # 2 GPUs, required: never across groups
        ("xxx.|xxx.", 2, R.NUMA_ALIGNED_REQUIRED, set()),
        ("x...|xxxx", 2, R.NUMA_ALIGNED_REQUIRED, {"12", "13", "23"}),
        # 4 GPUs: one whole NUMA group
        ("....|x...", 4, R.NUMA_ALIGNED_REQUIRED, {"0123"}),
        ("x...|x...", 4, R.NUMA_ALIGNED_REQUIRED, set()),
        # 8 GPUs: every slot of the host
        ("....|....", 8, R.FULL_HOST_SLOT_GROUP_REQUIRED, {"01234567"}),
        ("....|...x", 8, R.FULL_HOST_SLOT_GROUP_REQUIRED, set()),
        # any_healthy_slot for 2 allows a cross-group pair too
        ("xxx.|xxx.", 2, R.ANY_HEALTHY_SLOT, {"37"}),
    ],
)
def test_choices_per_rule(picture: str, g: int, rule: R, expected: set[str]) -> None:
    got = {slots(c.mask) for c in t.choices(H200, free(picture), g, rule)}
    assert got == expected
    assert t.fits(H200, free(picture), g, rule) is bool(expected)


@pytest.mark.parametrize(
    ("picture", "g", "chosen", "tier"),
    [
        ("x...|xxxx", 2, "23", t.TIER_ALIGNED),  # a whole PCIe pair
        ("x...|xxxx", 2, "12", t.TIER_GROUP),  # same group, split pair
        ("xxx.|xxx.", 2, "37", t.TIER_SPREAD),  # across groups
        ("....|xxxx", 4, "0123", t.TIER_ALIGNED),
    ],
)
def test_tiers(picture: str, g: int, chosen: str, tier: int) -> None:
    by_slots = {
        slots(c.mask): c
        for c in t.choices(H200, free(picture), g, R.NUMA_ALIGNED_PREFERRED if g == 2 else R.NUMA_ALIGNED_REQUIRED)
    }
    assert by_slots[chosen].tier == tier


@pytest.mark.parametrize(
    ("picture", "g", "rule", "stranded"),
    [
        ("....|....", 4, R.NUMA_ALIGNED_REQUIRED, 0),
        ("x...|....", 4, R.NUMA_ALIGNED_REQUIRED, 3),
        ("x...|x...", 4, R.NUMA_ALIGNED_REQUIRED, 6),
        ("x...|x...", 2, R.NUMA_ALIGNED_REQUIRED, 2),
        ("x...|x...", 2, R.NUMA_ALIGNED_PREFERRED, 0),
        ("x...|....", 8, R.FULL_HOST_SLOT_GROUP_REQUIRED, 7),
        ("....|....", 8, R.FULL_HOST_SLOT_GROUP_REQUIRED, 0),
        ("xxx.|xxxx", 1, R.ANY_HEALTHY_SLOT, 0),
    ],
)
def test_stranded(picture: str, g: int, rule: R, stranded: int) -> None:
    assert t.stranded(H200, free(picture), g, rule) == stranded


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("x...|....", "....|...x", True),  # mirror images
        ("x...|....", ".x..|....", True),  # swap within a pair
        ("xx..|....", "x.x.|....", False),  # a whole pair vs two split pairs
        ("xx..|....", "xxxx|....", False),
    ],
)
def test_signature_is_shape_up_to_symmetry(a: str, b: str, same: bool) -> None:
    assert (t.signature(H200, free(a)) == t.signature(H200, free(b))) is same


def test_layout_without_pairs_treats_slots_as_units() -> None:
    lay = t.layout_of([("g0", None), ("g0", None), ("g1", None)])
    assert lay.size == 3
    assert [c.tier for c in t.choices(lay, lay.full, 2, R.NUMA_ALIGNED_REQUIRED)] == [t.TIER_ALIGNED]


def test_layout_refuses_a_position_twice() -> None:
    with pytest.raises(ValueError, match="two units"):
        t.layout([[[0, 1]], [[1]]])
