"""Rewipe requests (`gpuaas slot rewipe`): an operator asks a host to run a blocked slot's cleanup again.

The row (migration 0054) and an outbox event `slot.rewipe_requested` are
written in one transaction, so the request is audited (who, why, when). The
node's host agent answers it (`accepted`: it cleared the block and runs wipe,
verify and the health step; `refused`: with its reason); nothing here touches
a disk or a claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from reconciler.store.connections import Connection
from schemas import dberrors


@dataclass(frozen=True, slots=True)
class Requested:
    node: str
    slot_index: int
    outcome: str  # requested | already_pending | unknown
    request_id: int | None
    slot_status: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "slot_index": self.slot_index,
            "outcome": self.outcome,
            "request_id": self.request_id,
            "slot_status": self.slot_status,
        }


def request(conn: Connection, node: str, slot_index: int, *, requested_by: str, reason: str) -> Requested:
    with dberrors.wrapped(f"request a rewipe of {node}:{slot_index}"), conn.transaction():
        row = conn.execute(
            "SELECT s.status::text FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE n.name = %s AND s.slot_index = %s AND s.present",
            (node, slot_index),
        ).fetchone()
        if row is None:
            return Requested(node, slot_index, "unknown", None, None)
        status = str(row[0])
        open_ = conn.execute(
            "SELECT id FROM slot_rewipe_requests WHERE node_name = %s AND slot_index = %s AND state = 'pending'",
            (node, slot_index),
        ).fetchone()
        if open_ is not None:
            return Requested(node, slot_index, "already_pending", int(open_[0]), status)
        rid = conn.execute(
            "INSERT INTO slot_rewipe_requests (node_name, slot_index, requested_by, reason)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (node, slot_index, requested_by, reason),
        ).fetchone()
        assert rid is not None  # noqa: S101 -- INSERT ... RETURNING returns the row
        conn.execute(
            "INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)"
            " VALUES ('slot.rewipe_requested', 'slot', %s, %s)",
            (
                f"{node}:{slot_index}",
                Jsonb(
                    {
                        "request_id": int(rid[0]),
                        "node": node,
                        "slot_index": slot_index,
                        "requested_by": requested_by,
                        "reason": reason,
                        "slot_status": status,
                    }
                ),
            ),
        )
    return Requested(node, slot_index, "requested", int(rid[0]), status)


def requests(conn: Connection, node: str | None = None) -> list[dict[str, Any]]:
    """Rewipe requests, newest first (all nodes, or one)."""
    with dberrors.wrapped("read rewipe requests"):
        return list(
            conn.cursor(row_factory=dict_row)
            .execute(
                "SELECT id, node_name, slot_index, requested_by, reason, requested_at, state, answered_at, answer"
                " FROM slot_rewipe_requests WHERE %(all)s OR node_name = %(node)s ORDER BY id DESC LIMIT 200",
                {"all": node is None, "node": node or ""},
            )
            .fetchall()
        )
