"""The row helpers every service read shares: the query wrapper, ISO timestamps, and the slot display states."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.rows import dict_row

from reconciler.store.connections import Connection
from schemas import dberrors

SLOT_STATES = (
    "available",
    "reserved",
    "provisioning",
    "active",
    "leased",
    "releasing",
    "cleanup",
    "blocked",
    "failed",
    "disabled",
    "ineligible",
    "drift",
)
ALLOCATION_STATES = ("pending", "reserved", "provisioning", "active", "releasing", "released", "failed")


# The display state of a slot row `s` (see reads.py's docstring; drift is added in Python or by DRIFT_SLOTS).
# A free slot of a node leased whole (a live node_exclusive claim) is `leased`: never sold as a slot.
_SLOT_STATE_SQL = (
    "CASE WHEN s.status = 'cleanup_blocked' THEN 'blocked'"
    " WHEN s.status = 'available' AND EXISTS (SELECT 1 FROM allocation_resource_claims lc"
    " WHERE lc.node_id = s.node_id AND lc.claim_kind = 'node_exclusive'"
    " AND lc.status IN ('reserved', 'provisioning', 'active', 'releasing')) THEN 'leased'"
    " WHEN s.status = 'available' AND NOT s.eligible THEN 'ineligible' ELSE s.status::text END"
)


def iso(value: Any) -> Any:
    """Timestamps as ISO 8601 text; everything else unchanged."""
    return value.isoformat() if isinstance(value, dt.datetime | dt.date) else value


def _rows(conn: Connection, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict[str, Any]]:
    with dberrors.wrapped("read for the service"):
        return conn.cursor(row_factory=dict_row).execute(query, params).fetchall()
