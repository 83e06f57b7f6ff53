"""The claim snapshot's profile, end to end: apply encodes it, the SQL stores and reads it, the host plan decodes it.

    schemas.snapshots.profile_to_json ─▶ gpuaas_place(_batch) ─▶ resource_snapshot.profile ─▶ host plan VmSpec
                                              └─▶ allocations.placement.profile (the name)

The SQL keeps the profile object as apply passed it and reads only keys the
codec defines, so the codec is the one place the key set is spelled. These
tests fail if a migration starts building, trimming or extending the object,
or reads a key the codec does not write.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from desired.state import DesiredState
from reconciler.plans import Placement
from reconciler.store import claims, hostplans, migrations
from reconciler.store.connections import Connection
from schemas import snapshots
from schemas.errors import PermanentError
from schemas.snapshots import Profile
from tests.test_snapshots import OLD_ROW

NODE = "node-00000"
# Every field away from its default, so a key the SQL dropped would show.
PROFILE = Profile(
    "bench_1g_24c_64g", 1, 24, 65536, hugepages_enabled=True, hugepage_size="1G", derived=True, readiness_timeout_s=600
)
PLACE = "SELECT outcome FROM gpuaas_place(%s, %s, %s, 'slot', %s::jsonb, 'bench-ubuntu-24.04', 'rev1')"
# `profile -> 'key'` / `profile ->> 'key'` in any migration (p_profile, c.profile, snapshot -> 'profile' -> ...).
_SQL_READ = re.compile(r"profile'?\s*->>?\s*'(\w+)'")


def _placement(alloc: str, slot: int) -> Placement:
    return Placement(
        allocation_id=alloc,
        tenant="t",
        sku="bench-h200-slice",
        capacity_shape="gpu_slice",
        gpu_count=1,
        region="bench-1",
        node=NODE,
        slot_indexes=(slot,),
        profile=PROFILE,
        image="bench-ubuntu-24.04",
    )


def _stored(conn: Connection, alloc: str) -> tuple[Any, Any]:
    row = conn.execute(
        "SELECT c.resource_snapshot -> 'profile', a.placement ->> 'profile'"
        " FROM allocation_resource_claims c JOIN allocations a ON a.id = c.allocation_id"
        " WHERE c.allocation_id = %s",
        (alloc,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def _vm(conn: Connection, alloc: str) -> Any:
    plan = hostplans.build(conn, NODE)
    assert plan is not None
    return next(v for v in plan.vms if v.allocation_id == alloc)


def test_apply_stores_the_codec_json_that_sql_keeps_and_the_host_plan_decodes(
    conn: Connection, fleet: DesiredState
) -> None:
    assert claims.place(conn, _placement("alloc-0000000", 3)).placed

    profile, placed_name = _stored(conn, "alloc-0000000")
    assert set(profile) == set(snapshots.PROFILE_KEYS)  # nothing dropped or added on the way in
    assert profile == snapshots.profile_to_json(PROFILE)
    assert snapshots.profile_from_json(profile) == PROFILE
    assert placed_name == PROFILE.name  # the one key the SQL reads
    vm = _vm(conn, "alloc-0000000")
    assert (vm.vcpu_count, vm.memory_mib, vm.hugepages, vm.hugepage_size) == (24, 65536, True, "1G")
    assert vm.readiness_timeout_s == 600


def test_every_profile_key_the_sql_reads_is_one_the_codec_writes() -> None:
    read = {key for m in migrations.available() for key in _SQL_READ.findall(m.sql)}
    assert read, "the placing functions read the profile name; the pattern no longer finds it"
    assert read <= set(snapshots.PROFILE_KEYS), read - set(snapshots.PROFILE_KEYS)


def test_a_row_written_before_the_codec_still_makes_the_same_vm(conn: Connection, fleet: DesiredState) -> None:
    row = conn.execute(PLACE, ("alloc-0000001", NODE, [4], OLD_ROW)).fetchone()
    assert row is not None and row[0] == "placed"
    vm = _vm(conn, "alloc-0000001")
    assert (vm.vcpu_count, vm.memory_mib, vm.hugepages, vm.hugepage_size) == (48, 131072, True, "1G")


@pytest.mark.parametrize(
    ("profile", "code"),
    [
        ('{"name": "p", "gpu_count": 1, "vcpu_count": 24, "memory_mib": 65536}', snapshots.MISSING_KEY),
        (OLD_ROW[:-1] + ', "cpu_model": "host"}', snapshots.UNKNOWN_KEY),
        (OLD_ROW.replace('"vcpu_count": 48', '"vcpu_count": "48"'), snapshots.BAD_VALUE),
        (None, snapshots.NO_PROFILE),
    ],
)
def test_a_corrupt_snapshot_profile_stops_the_host_plan_with_its_code(
    conn: Connection, fleet: DesiredState, profile: str | None, code: str
) -> None:
    # The SQL takes any object: the codec, not the database, refuses it, before a VM gets guessed sizes.
    row = conn.execute(PLACE, ("alloc-0000002", NODE, [5], profile)).fetchone()
    assert row is not None and row[0] == "placed"
    with pytest.raises(PermanentError) as refused:
        hostplans.build(conn, NODE)
    assert refused.value.code == code and "alloc-0000002" in refused.value.message
