"""Pending requests past their deadline end `failed` with `sku_unavailable` (policies/deadlines.py decides which).

Run by every reconciliation after placement: a request placed in this pass
is no longer pending and is never failed. Each expiry is one transaction:
the allocation becomes `failed` (failure_code `sku_unavailable`, the message
carrying the last pending reason) only if it is still pending, and an
`allocation.failed` outbox event carries the reason chain (the pending code,
message and details), so the history, `gpuaas status`, the API and the
portal's event stream all show it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from psycopg.types.json import Jsonb

from desired import models as m
from desired.state import DesiredState
from policies import deadlines
from reconciler.store.connections import Connection
from schemas import dberrors


@dataclass(frozen=True, slots=True)
class Expired:
    allocation_id: str
    deadline_s: int
    pending_code: str | None


def expire(conn: Connection, state: DesiredState, *, now: dt.datetime | None = None) -> tuple[Expired, ...]:
    placement = state.fleet.placement if state.fleet else m.PlacementSettings()
    with dberrors.wrapped("read pending allocations for their deadline"):
        rows = conn.execute(
            "SELECT id, sku, requested_at, created_at, pending_code, pending_message, pending_details, now()"
            " FROM allocations WHERE present AND status = 'pending' AND desired_state = 'present'"
        ).fetchall()
    out: list[Expired] = []
    for aid, sku, requested_at, seen_at, code, text, details, db_now in rows:
        seconds = deadlines.seconds_for(placement, sku)
        if not deadlines.overdue(requested_at=requested_at, seen_at=seen_at, now=now or db_now, seconds=seconds):
            continue
        message = deadlines.message(seconds, code, text)
        with dberrors.wrapped(f"fail {aid} past its pending deadline"), conn.transaction():
            done = conn.execute(
                "UPDATE allocations SET status = 'failed', failure_code = %s, failure_message = %s,"
                " failed_at = now(), status_changed_at = now(), updated_at = now()"
                " WHERE id = %s AND status = 'pending' RETURNING id",
                (deadlines.CODE, message, aid),
            ).fetchone()
            if done is None:
                continue  # placed or released meanwhile
            conn.execute(
                "INSERT INTO outbox (event_type, aggregate_type, aggregate_id, payload)"
                " VALUES ('allocation.failed', 'allocation', %s, %s)",
                (
                    aid,
                    Jsonb(
                        {
                            "allocation_id": aid,
                            "code": deadlines.CODE,
                            "message": message,
                            "deadline_s": seconds,
                            "reasons": [{"code": code, "message": text, "details": details}],
                        }
                    ),
                ),
            )
        out.append(Expired(aid, seconds, code))
    return tuple(out)
