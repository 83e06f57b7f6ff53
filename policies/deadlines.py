"""The pending deadline (pure): when an unplaceable request stops waiting and ends `failed` with `sku_unavailable`.

The clock starts when the store first saw the request (`seen_at`), or at its
`requested_at` if that is later: a request file committed days after its
requested_at still gets the whole deadline. The policy is the Fleet's
`placement.pending_deadline_seconds`, overridden per SKU by
`placement.pending_deadline_by_sku`; 0 means never.
"""

from __future__ import annotations

import datetime as dt

from desired import models as m

CODE = "sku_unavailable"


def seconds_for(placement: m.PlacementSettings, sku: str) -> int:
    return placement.pending_deadline_by_sku.get(sku, placement.pending_deadline_seconds)


def overdue(*, requested_at: dt.datetime, seen_at: dt.datetime, now: dt.datetime, seconds: int) -> bool:
    if seconds <= 0:
        return False
    start = max(requested_at, seen_at)
    return (now - start).total_seconds() >= seconds


def message(seconds: int, pending_code: str | None, pending_message: str | None) -> str:
    why = f"{pending_code}: {pending_message}" if pending_code else "no reason recorded"
    return f"pending longer than the deadline of {seconds}s; the last reason it could not be placed: {why}"
