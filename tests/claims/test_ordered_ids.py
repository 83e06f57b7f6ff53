"""Node and slot ids follow the order rows are written (migration 0088, `gpuaas_uuid7`).

The host plans' read of a batch of nodes (`hostplans._inputs`) bounds it by
the batch's lowest and highest id, which is a narrow range of the slot
index only when ids grow with the order nodes were written.
"""

from __future__ import annotations

import uuid

from reconciler.reconcile import reconciling
from reconciler.store.connections import Connection
from tests.claims.conftest import small_fleet


def test_gpuaas_uuid7_is_a_version_7_uuid_that_grows_with_time(conn: Connection) -> None:
    row = conn.execute("SELECT gpuaas_uuid7(), pg_sleep(0.002), gpuaas_uuid7()").fetchone()
    assert row is not None
    first, _, second = row
    assert isinstance(first, uuid.UUID) and isinstance(second, uuid.UUID)
    assert first.version == second.version == 7
    assert first.variant == second.variant == uuid.RFC_4122
    assert first < second  # two milliseconds apart: the time prefix decides
    assert first.int >> 80 <= second.int >> 80
    many = [r[0] for r in conn.execute("SELECT gpuaas_uuid7() FROM generate_series(1, 1000)")]
    assert len(set(many)) == 1000  # the random tail tells ids of one millisecond apart


def test_a_cold_sync_gives_nodes_and_slots_ids_in_the_order_it_writes_them(conn: Connection) -> None:
    state = small_fleet()
    reconciling.reconcile(conn, state)
    nodes = conn.execute("SELECT name, id FROM nodes ORDER BY name").fetchall()
    assert len(nodes) == len(state.nodes) > 1
    stamps = [node_id.int >> 80 for _, node_id in nodes]  # the millisecond each was written
    assert stamps == sorted(stamps)  # written in name order: a batch of names is a range of ids
    slots = conn.execute(
        "SELECT s.id FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id ORDER BY n.name, s.slot_index"
    ).fetchall()
    assert len(slots) > len(nodes)
    assert all(s.version == 7 for (s,) in slots)
    slot_stamps = [s.int >> 80 for (s,) in slots]
    assert slot_stamps == sorted(slot_stamps)
