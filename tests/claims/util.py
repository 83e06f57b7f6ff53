"""Small SQL helpers for hand-made claims and host reports in tests."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from reconciler.store.connections import Connection


def insert_slot_claim(conn: Connection, allocation: str, node: str, slot: int, status: str = "reserved") -> None:
    conn.execute(
        "INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, slot_index, claim_kind, status,"
        " resource_snapshot) SELECT %s, n.id, s.id, s.slot_index, 'slot', %s,"
        " jsonb_build_object('gpus', 1, 'slot', jsonb_build_object('nvme_device', s.nvme_device))"
        " FROM nodes n JOIN node_resource_slots s ON s.node_id = n.id WHERE n.name = %s AND s.slot_index = %s",
        (allocation, status, node, slot),
    )


def insert_node_claim(conn: Connection, allocation: str, node: str, status: str = "reserved") -> None:
    conn.execute(
        "INSERT INTO allocation_resource_claims (allocation_id, node_id, claim_kind, status, resource_snapshot)"
        " SELECT %s, id, 'node_exclusive', %s, '{\"gpus\": 8}' FROM nodes WHERE name = %s",
        (allocation, status, node),
    )


def slot_status(conn: Connection, node: str, slot: int) -> str:
    row = conn.execute(
        "SELECT s.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
        " WHERE n.name = %s AND s.slot_index = %s",
        (node, slot),
    ).fetchone()
    assert row is not None
    return str(row[0])


def allocation(conn: Connection, allocation_id: str) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM allocations WHERE id = %s", (allocation_id,))
    row = cur.fetchone()
    assert row is not None and cur.description is not None
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def count(conn: Connection, query: str, *params: Any) -> int:
    row = conn.execute(query.encode(), params or None).fetchone()
    assert row is not None
    return int(row[0])


def report_wipe(
    conn: Connection,
    node: str,
    slot: int,
    allocation_id: str,
    *,
    state: str = "verified",
    device: str | None = None,
    signature_clear: bool = True,
    sampled_zero: bool = True,
) -> None:
    """What the host reconciler writes after wiping a released slot's disk."""
    if device is None:
        row = conn.execute(
            "SELECT s.nvme_device FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE n.name = %s AND s.slot_index = %s",
            (node, slot),
        ).fetchone()
        assert row is not None
        device = str(row[0])
    evidence = {
        "device": device,
        "signature_clear": signature_clear,
        "sampled_zero": sampled_zero,
        "method": "wipefs+blkdiscard",
    }
    conn.execute(
        "INSERT INTO host_slot_status (node_name, slot_index, wipe_allocation_id, wipe_state, wipe_evidence,"
        " wipe_reported_at, wipe_error) VALUES (%s, %s, %s, %s, %s, clock_timestamp(), %s)"
        " ON CONFLICT (node_name, slot_index) DO UPDATE SET wipe_allocation_id = EXCLUDED.wipe_allocation_id,"
        " wipe_state = EXCLUDED.wipe_state, wipe_evidence = EXCLUDED.wipe_evidence,"
        " wipe_reported_at = EXCLUDED.wipe_reported_at, wipe_error = EXCLUDED.wipe_error, updated_at = now()",
        (node, slot, allocation_id, state, Jsonb(evidence), None if state == "verified" else "wipe failed"),
    )


def report_vm(conn: Connection, node: str, slot: int, allocation_id: str, vm_state: str) -> None:
    conn.execute(
        "INSERT INTO host_slot_status (node_name, slot_index, allocation_id, vm_state, vm_ready_at)"
        " VALUES (%s, %s, %s, %s, CASE WHEN %s = 'ready' THEN clock_timestamp() END)"
        " ON CONFLICT (node_name, slot_index) DO UPDATE SET allocation_id = EXCLUDED.allocation_id,"
        " vm_state = EXCLUDED.vm_state, vm_ready_at = EXCLUDED.vm_ready_at, updated_at = now()",
        (node, slot, allocation_id, vm_state, vm_state),
    )
