"""What the hosts reported: `host_status` and `host_slot_status`, read back by the central reconciler.

Each host writes its own rows (schemas/hostrows.py, through the service's
agent API or the lab's direct connection); the reconciler, as table owner,
reads every node's (`gpuaas drift`). On a node's own connection row-level
security shows that node's rows only. The reports are untrusted input:
`schemas.driftreports.checked` validates them before they are shown.
"""

from __future__ import annotations

from typing import Any

from reconciler.store.connections import Connection
from schemas import dberrors


def read(conn: Connection, node: str | None = None) -> list[dict[str, Any]]:
    """Node status rows with their slot rows (all visible nodes, or one), as `schemas.driftreports` reads them."""
    where = "WHERE s.node_name = %s" if node else ""
    with dberrors.wrapped("read host status"):
        rows = conn.execute(
            f"""SELECT s.node_name, s.observed_generation, s.reported_at, s.healthy, s.drift,
                       s.errors, s.details, p.generation
                FROM host_status s LEFT JOIN host_plans p USING (node_name)
                {where} ORDER BY s.node_name""",  # noqa: S608 -- fixed fragment, value bound
            (node,) if node else (),
        ).fetchall()
        slot_rows = conn.execute(
            f"""SELECT node_name, slot_index, allocation_id, vm_state, wipe_state, wipe_error,
                       wipe_evidence, drift, updated_at
                FROM host_slot_status s {where} ORDER BY node_name, slot_index""",  # noqa: S608
            (node,) if node else (),
        ).fetchall()
    slots: dict[str, list[dict[str, Any]]] = {}
    for r in slot_rows:
        slots.setdefault(r[0], []).append(
            {
                "slot_index": r[1],
                "allocation_id": r[2],
                "vm_state": r[3],
                "wipe_state": r[4],
                "wipe_error": r[5],
                "wipe_evidence": r[6],
                "drift": r[7],
                "updated_at": str(r[8]),
            }
        )
    return [
        {
            "node": r[0],
            "observed_generation": r[1],
            "reported_at": str(r[2]),
            "healthy": r[3],
            "drift": r[4],
            "errors": r[5],
            "details": r[6],
            "plan_generation": r[7],
            "slots": slots.get(r[0], []),
        }
        for r in rows
    ]
