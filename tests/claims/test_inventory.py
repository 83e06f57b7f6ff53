"""Inventory sync: upsert, disable what disappeared, never delete, and a repeated revision writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from desired import models as m
from reconciler import sources
from reconciler.reconcile import reconciling
from reconciler.store import checks, claims, inventory, inventorywrites, live
from reconciler.store.connections import Connection
from tests.claims import util
from tests.claims.conftest import small_fleet
from tests.claims.test_apply import slice_placement

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"
TABLES = (
    "fleet_settings",
    "sku_catalog",
    "os_images",
    "nodes",
    "node_resource_slots",
    "allocations",
    "allocation_resource_claims",
    "outbox",
    "desired_revisions",
    "host_plans",
)


def snapshot(conn: Connection) -> dict[str, list[tuple[object, ...]]]:
    """Every row with its xmin: any write (even a no-op UPDATE) changes xmin."""
    out = {}
    for table in TABLES:
        query = f"SELECT xmin::text, * FROM {table} ORDER BY 2"  # noqa: S608 - constant table names
        rows = conn.execute(query.encode()).fetchall()
        out[table] = [tuple(r) for r in rows]
    return out


def test_sync_projects_the_desired_state(conn: Connection) -> None:
    result = inventory.sync(conn, small_fleet())
    counts = result.counts()
    assert counts["node.added"] == 6 and counts["slot.added"] == 32 and counts["allocation.added"] == 28
    assert result.new_revision and result.revision.startswith("tree:")
    assert util.count(conn, "SELECT count(*) FROM node_resource_slots WHERE eligible AND status = 'available'") == 32
    assert util.count(conn, "SELECT count(*) FROM nodes WHERE capability = 'both_capable'") == 4


# A cold sync writes new rows by COPY (from inventorywrites.COPY_FROM rows on): both ways must write exactly
# the rows the next sync's comparison expects (a type COPY spells differently would show as a change).
WRITE_PATHS = pytest.mark.parametrize("copy_from", [1, 10**9], ids=["copy", "insert"])


@WRITE_PATHS
def test_same_revision_twice_writes_nothing(conn: Connection, monkeypatch: pytest.MonkeyPatch, copy_from: int) -> None:
    monkeypatch.setattr(inventorywrites, "COPY_FROM", copy_from)
    state = small_fleet()
    inventory.sync(conn, state)
    before = snapshot(conn)
    again = inventory.sync(conn, state)
    assert not again.changed and not again.new_revision
    assert snapshot(conn) == before


def test_what_disappears_is_disabled_never_deleted(conn: Connection) -> None:
    state = small_fleet()
    inventory.sync(conn, state)
    assert claims.place(conn, slice_placement("alloc-0000000", "node-00000", (0,))).placed
    smaller = small_fleet()
    del smaller.nodes["node-00000"], smaller.slot_maps["node-00000"], smaller.allocations["alloc-0000001"]
    smaller.revision = "rev-2"
    result = inventory.sync(conn, smaller)
    removed = {(c.kind, c.key) for c in result.changes if c.action == "removed"}
    assert ("node", "node-00000") in removed and ("allocation", "alloc-0000001") in removed
    assert ("slot", "node-00000:0") in removed
    assert util.count(conn, "SELECT count(*) FROM nodes") == 6  # nothing deleted
    assert util.slot_status(conn, "node-00000", 0) == "reserved"  # the claimed slot keeps its claim
    assert util.slot_status(conn, "node-00000", 1) == "disabled"  # free ones are disabled
    assert checks.run(conn) == []
    # Coming back restores them.
    state.revision = "rev-3"
    back = inventory.sync(conn, state)
    assert ("node", "node-00000", "restored") in {(c.kind, c.key, c.action) for c in back.changes}
    assert util.slot_status(conn, "node-00000", 1) == "available"


def test_a_changed_slot_map_updates_eligibility(conn: Connection) -> None:
    state = small_fleet()
    inventory.sync(conn, state)
    smap = state.slot_maps["node-00001"]
    slots = list(smap.slots)
    slots[2] = slots[2].model_copy(update={"fabric_claim_mode": m.FabricClaimMode.SHARED_HOST})
    state.slot_maps["node-00001"] = smap.model_copy(update={"slots": tuple(slots)})
    state.revision = "rev-2"
    result = inventory.sync(conn, state)
    assert [c.render() for c in result.changes] == ["slot node-00001:2 changed"]
    row = conn.execute(
        "SELECT eligible, ineligible_reasons FROM node_resource_slots s JOIN nodes n"
        " ON n.id = s.node_id WHERE n.name = 'node-00001' AND slot_index = 2"
    ).fetchone()
    assert row == (False, ["slot.fabric_not_per_slot_vf"])
    assert 2 not in live.free_slots(conn).get("node-00001", [])


@WRITE_PATHS
def test_reapplying_the_example_fleet_is_a_no_op(
    conn: Connection, monkeypatch: pytest.MonkeyPatch, copy_from: int
) -> None:
    monkeypatch.setattr(inventorywrites, "COPY_FROM", copy_from)
    loaded = sources.load(EXAMPLES)
    assert not loaded.errors
    first = reconciling.reconcile(conn, loaded.state, source="test")
    assert first.changed and first.applied.placed
    before = snapshot(conn)
    outbox = util.count(conn, "SELECT count(*) FROM outbox")
    second = reconciling.reconcile(conn, loaded.state, source="test")
    assert not second.changed, reconciling.summary(second)
    assert not second.applied.placed and not any(w.changed for w in second.host_plans)
    assert snapshot(conn) == before
    assert util.count(conn, "SELECT count(*) FROM outbox") == outbox
    assert checks.run(conn) == []
    results = [r[0] for r in conn.execute("SELECT result FROM reconciliations ORDER BY id")]
    assert results == ["changed", "unchanged"]
