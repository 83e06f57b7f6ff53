"""GPU-hours and amounts per allocation and per tenant over a time window, from the claim snapshots.

Usage starts when a claim became active and stops when its release was
requested (the `claim_usage` view of migration 0006); the GPU count and the
hourly price come from the claim's immutable snapshot, so a later price
change in git never rewrites a past bill. A claim counts only for the part
of its usage inside [from, to) (prorated to the second); usage still running
counts up to the transaction's `now()`. Amounts are in the currency's minor
unit (cents), rounded once per allocation.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from psycopg.rows import dict_row

from reconciler import codes as reconciler_codes
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.errors import UsageError

_SQL = """
WITH w AS (
    SELECT u.allocation_id, a.tenant, a.sku, u.gpus, u.gpu_hourly_price_minor AS price, u.currency,
           greatest(u.usage_started_at, %(from)s) AS s,
           least(coalesce(u.usage_ended_at, now()), %(to)s, now()) AS e
    FROM claim_usage u JOIN allocations a ON a.id = u.allocation_id
    WHERE (%(tenant)s::text IS NULL OR a.tenant = %(tenant)s)
)
SELECT allocation_id, tenant, sku, currency, max(price) AS gpu_hourly_price_minor, count(*) AS claims,
       sum(gpus) AS gpus, min(s) AS usage_from, max(e) AS usage_to,
       sum(gpus * extract(epoch FROM e - s) / 3600.0) AS gpu_hours,
       round(sum(gpus * extract(epoch FROM e - s) / 3600.0 * price))::bigint AS amount_minor
FROM w WHERE e > s
GROUP BY allocation_id, tenant, sku, currency
ORDER BY tenant, allocation_id, currency
"""


def parse_time(text: str, *, what: str) -> dt.datetime:
    """`YYYY-MM-DD` (midnight UTC) or an ISO 8601 time (UTC when it names no offset)."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
    except ValueError as e:
        raise UsageError(
            f"{what}: {text!r} is not a date (YYYY-MM-DD) or an ISO 8601 time", code=reconciler_codes.USAGE_BAD_TIME
        ) from e
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def default_window(now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The current calendar month (UTC) up to now."""
    start = now.astimezone(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return start, now


def _hours(value: Decimal | float | None) -> float:
    return round(float(value or 0), 4)


def usage(conn: Connection, *, start: dt.datetime, end: dt.datetime, tenant: str | None = None) -> dict[str, Any]:
    """Per allocation and per tenant (and currency): GPU-hours and amount inside [start, end)."""
    if end <= start:
        raise UsageError(
            f"the window is empty: --to {end.isoformat()} is not after --from {start.isoformat()}",
            code=reconciler_codes.USAGE_EMPTY_WINDOW,
        )
    with dberrors.wrapped("read usage"):
        rows = conn.cursor(row_factory=dict_row).execute(_SQL, {"from": start, "to": end, "tenant": tenant}).fetchall()
    allocations = [
        {
            "allocation_id": r["allocation_id"],
            "tenant": r["tenant"],
            "sku": r["sku"],
            "claims": int(r["claims"]),
            "gpus": int(r["gpus"] or 0),
            "usage_from": r["usage_from"].isoformat(),
            "usage_to": r["usage_to"].isoformat(),
            "gpu_hours": _hours(r["gpu_hours"]),
            "gpu_hourly_price_minor": r["gpu_hourly_price_minor"],
            "currency": r["currency"],
            "amount_minor": int(r["amount_minor"] or 0),
        }
        for r in rows
    ]
    tenants: dict[tuple[str, str], dict[str, Any]] = {}
    for a in allocations:
        t = tenants.setdefault(
            (a["tenant"], a["currency"]),
            {"tenant": a["tenant"], "currency": a["currency"], "allocations": 0, "gpu_hours": 0.0, "amount_minor": 0},
        )
        t["allocations"] += 1
        t["gpu_hours"] = round(t["gpu_hours"] + a["gpu_hours"], 4)
        t["amount_minor"] += a["amount_minor"]
    return {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "tenant": tenant,
        "allocations": allocations,
        "tenants": list(tenants.values()),
    }
