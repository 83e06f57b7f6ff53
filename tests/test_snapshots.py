"""The claim snapshot's profile codec (schemas.snapshots): round trip, and refusal of anything else."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies import profiles
from schemas import snapshots
from schemas.errors import PermanentError
from schemas.snapshots import Profile

# Byte for byte what apply wrote before the codec existed (reconciler/store/claims.py `_profile_json`):
# rows already in a database must keep decoding.
OLD_ROW = (
    '{"name": "h200_2g_48c_128g", "gpu_count": 2, "vcpu_count": 48, "memory_mib": 131072,'
    ' "hugepages_enabled": true, "hugepage_size": "1G", "derived": true}'
)
FULL = Profile("h200_2g_48c_128g", 2, 48, 131072, hugepages_enabled=True, hugepage_size="1G", derived=True)


@pytest.mark.parametrize(
    "profile",
    [
        Profile("bench_1g_24c_64g", 1, 24, 65536),
        FULL,
        Profile("odd-x3", 3, 1, 1, hugepages_enabled=True, hugepage_size="2M"),
    ],
)
def test_a_profile_survives_the_round_trip_through_json_text(profile: Profile) -> None:
    text = json.dumps(snapshots.profile_to_json(profile))
    assert snapshots.profile_from_json(json.loads(text)) == profile


def test_baremetal_has_no_profile_both_ways() -> None:
    assert snapshots.profile_to_json(None) is None
    assert snapshots.profile_from_json(None) is None


def test_the_encoded_json_is_what_apply_always_wrote() -> None:
    assert json.dumps(snapshots.profile_to_json(FULL)) == OLD_ROW
    assert snapshots.profile_from_json(json.loads(OLD_ROW)) == FULL


def test_the_key_set_is_the_profile_fields_the_policy_resolves() -> None:
    assert snapshots.PROFILE_KEYS == (
        "name",
        "gpu_count",
        "vcpu_count",
        "memory_mib",
        "hugepages_enabled",
        "hugepage_size",
        "derived",
        "readiness_timeout_s",
    )
    assert snapshots.OPTIONAL_KEYS == ("readiness_timeout_s",)  # absent in rows written before it
    assert profiles.Profile is Profile  # one type: the planner carries what claims snapshot


_DROP = object()  # a key to leave out


def _old(**change: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(OLD_ROW)
    for key, value in change.items():
        if value is _DROP:
            del doc[key]
        else:
            doc[key] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "code", "names"),
    [
        (_old(derived=_DROP), snapshots.MISSING_KEY, "derived"),
        (_old(vcpu_count=_DROP, memory_mib=_DROP), snapshots.MISSING_KEY, "vcpu_count, memory_mib"),
        (_old(numa_pinning="strict"), snapshots.UNKNOWN_KEY, "numa_pinning"),
        (_old(vcpu_count="48"), snapshots.BAD_VALUE, "vcpu_count"),
        (_old(vcpu_count=True), snapshots.BAD_VALUE, "vcpu_count"),
        (_old(memory_mib=None), snapshots.BAD_VALUE, "memory_mib"),
        (_old(hugepages_enabled=1), snapshots.BAD_VALUE, "hugepages_enabled"),
        (_old(hugepage_size=1), snapshots.BAD_VALUE, "hugepage_size"),
        (_old(name=None), snapshots.BAD_VALUE, "name"),
        (_old(readiness_timeout_s="45"), snapshots.BAD_VALUE, "readiness_timeout_s"),
        (_old(readiness_timeout_s=0), snapshots.BAD_VALUE, "readiness_timeout_s"),
        ([1, 2], snapshots.NOT_AN_OBJECT, "list"),
        ("bench_1g_24c_64g", snapshots.NOT_AN_OBJECT, "str"),
    ],
)
def test_a_corrupt_profile_is_refused_with_its_code(doc: object, code: str, names: str) -> None:
    with pytest.raises(PermanentError) as refused:
        snapshots.profile_from_json(doc, where="claim c1")
    assert refused.value.code == code
    assert refused.value.message.startswith("claim c1: ") and names in refused.value.message
