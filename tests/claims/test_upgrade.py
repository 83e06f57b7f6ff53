"""A database migrated before 0006, with live claims in it, upgrades and keeps working."""

from __future__ import annotations

import psycopg
import pytest

from reconciler.plans import Release
from reconciler.store import checks, claims, cleanup, connections, inventory, migrations
from tests.claims import util
from tests.claims.conftest import small_fleet
from tests.claims.test_apply import slice_placement

PROFILE = '{"name": "bench_1g_24c_64g", "gpu_count": 1, "vcpu_count": 24, "memory_mib": 65536}'
PLACE = "SELECT outcome FROM gpuaas_place(%s, %s, %s, 'slot', %s::jsonb, NULL, 'rev0')"


def test_0006_upgrades_a_store_with_live_claims(empty_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0011 alters a domain 0006 creates, so it comes after 0006 as in any real upgrade
    # and what was written after the ingress columns (0057: the inventory sync below writes them) comes
    # after it too: the ingress endpoints with their triggers (0058 on) and the later migrations that read 0011.
    # 0082 adds inventory columns the sync writes, so it is applied with the store as it was.
    later = [m.version for m in migrations.available() if m.version >= "0058" and m.version != "0082"]
    before = [m for m in migrations.available() if m.version not in ("0006", "0011", *later)]
    with connections.connect(empty_db_url, autocommit=True) as conn:
        with monkeypatch.context() as patched:  # the store as it was: 0001-0005 and 0050
            patched.setattr(migrations, "available", lambda: before)
            migrations.migrate(conn)
        inventory.sync(conn, small_fleet())
        for i, slot in enumerate((0, 1, 2)):
            row = conn.execute(PLACE, (f"alloc-000000{i}", "node-00000", [slot], PROFILE)).fetchone()
            assert row is not None and row[0] == "placed"
        # Every function that reads the retyped columns runs once in this session before the upgrade.
        assert claims.release(conn, Release("alloc-0000002", "node-00000", (2,))).outcome == "releasing"
        cleanup.free_cleaned(conn)
        conn.execute("SELECT gpuaas_absorb_vm_states()")
        conn.execute(
            "UPDATE allocation_resource_claims SET status = 'provisioning' WHERE allocation_id = %s", ("alloc-0000000",)
        )

        assert migrations.migrate(conn) == ["0006", "0011", *later]
        assert checks.run(conn) == []
        assert util.slot_status(conn, "node-00000", 2) == "cleanup"
        kinds = dict(
            conn.execute(
                "SELECT column_name, domain_name FROM information_schema.columns"
                " WHERE table_name = 'allocation_resource_claims' AND domain_name IS NOT NULL"
            ).fetchall()
        )
        assert kinds == {"claim_kind": "gpuaas_claim_kind", "status": "gpuaas_claim_status"}
        # The guards still refuse, the usage views still answer, and placing goes on where it was.
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            util.insert_slot_claim(conn, "alloc-0000003", "node-00000", 0)
        assert refused.value.diag.constraint_name == "claims_slot_claimable"
        r = claims.place(conn, slice_placement("alloc-0000003", "node-00000", (3,)))
        assert r.placed and util.slot_status(conn, "node-00000", 3) == "reserved"
        conn.execute(
            "UPDATE allocation_resource_claims SET status = 'active' WHERE allocation_id = %s", ("alloc-0000000",)
        )
        assert util.count(conn, "SELECT count(*) FROM allocation_usage WHERE allocation_id = 'alloc-0000000'") == 1
        assert claims.release(conn, Release("alloc-0000001", "node-00000", (1,))).outcome == "releasing"
        util.report_wipe(conn, "node-00000", 2, "alloc-0000002")
        freed = cleanup.free_cleaned(conn)
        assert util.slot_status(conn, "node-00000", 2) == "available", freed
        conn.execute("SELECT gpuaas_absorb_vm_states()")
        assert checks.run(conn) == []
