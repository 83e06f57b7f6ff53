"""The history documents: reconciliations newest first, and one allocation's lifecycle.

`gpuaas history -o json` prints them and the service serves them
(/api/v1/history), both from here. A reconciliation row says which revision,
what triggered it (a new revision or a retry, and from which source), when it
started, how long it took, its result (changed, unchanged, error), its
counts and its errors. An allocation's document is its current lifecycle
and its transitions oldest first (`reconciler.store.lifecycle.transitions`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reconciler.store.connections import Connection


def as_row(r: Any) -> dict[str, Any]:
    """One reconciliation (a `reconciler.store.history` row) as plain data."""
    took = (r.finished_at - r.started_at).total_seconds() if r.finished_at else None
    return {
        "id": r.id,
        "revision": r.revision,
        "source": r.source,
        "reconciler": r.reconciler,
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "seconds": took,
        "result": r.result,
        "counts": r.counts,
        "errors": r.errors,
    }


def recent(conn: Connection, limit: int = 20) -> list[dict[str, Any]]:
    """The newest `limit` reconciliations; none before the schema exists."""
    from reconciler.store import history, migrations

    return [as_row(r) for r in history.recent(conn, limit)] if migrations.applied(conn) else []


def allocation(conn: Connection, allocation_id: str) -> dict[str, Any] | None:
    """One allocation's lifecycle and transitions; None when the store has no such allocation."""
    from reconciler.store import lifecycle

    steps = lifecycle.transitions(conn, allocation_id)
    current = lifecycle.lifecycles(conn, [allocation_id]).get(allocation_id)
    if steps is None or current is None:
        return None
    current.pop("attempts", None)  # the transitions carry them
    return {"allocation_id": allocation_id, "lifecycle": current, "transitions": [t.as_dict() for t in steps]}
