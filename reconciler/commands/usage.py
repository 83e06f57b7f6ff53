"""`gpuaas usage [--from DATE] [--to DATE] [--tenant T] [-o csv|json|text]`: GPU-hours and amounts for billing.

Per allocation and per tenant over a window (default: this calendar month,
UTC, up to now), from the claims' own snapshots (GPU count, hourly price,
currency) and their usage times, prorated to the window to the second. The
same numbers as `GET /api/v1/usage`. Reads only (one read-only transaction).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
from typing import Any

from reconciler.commands import db
from schemas import output

CSV_FIELDS = (
    "tenant",
    "allocation_id",
    "sku",
    "gpus",
    "usage_from",
    "usage_to",
    "gpu_hours",
    "gpu_hourly_price_minor",
    "currency",
    "amount_minor",
)


def register(sub: Any) -> None:
    p = sub.add_parser("usage", help="GPU-hours and amounts per allocation and tenant over a window")
    p.add_argument("--from", dest="start", help="start, inclusive: YYYY-MM-DD or ISO 8601 (default: this month)")
    p.add_argument("--to", dest="end", help="end, exclusive: YYYY-MM-DD or ISO 8601 (default: now)")
    p.add_argument("--tenant", help="only this tenant")
    output.add_argument(p, "text", "csv")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _money(minor: int, currency: str | None) -> str:
    return f"{minor / 100:.2f} {currency or ''}".rstrip()


def render_text(doc: dict[str, Any]) -> str:
    out = [
        f"Usage from {doc['from']} to {doc['to']}" + (f" for tenant {doc['tenant']}" if doc["tenant"] else ""),
        "",
        f"  {'TENANT':<18} {'ALLOCATIONS':>11} {'GPU-HOURS':>12} {'AMOUNT':>16}",
    ]
    for t in doc["tenants"]:
        out.append(
            f"  {t['tenant']:<18} {t['allocations']:>11} {t['gpu_hours']:>12.4f} "
            f"{_money(t['amount_minor'], t['currency']):>16}"
        )
    if not doc["tenants"]:
        out.append("  (no usage in this window)")
    out += ["", f"  {'ALLOCATION':<26} {'TENANT':<18} {'SKU':<26} {'GPUS':>4} {'GPU-HOURS':>12} {'AMOUNT':>16}"]
    for a in doc["allocations"]:
        out.append(
            f"  {a['allocation_id']:<26} {a['tenant']:<18} {a['sku']:<26} {a['gpus']:>4} "
            f"{a['gpu_hours']:>12.4f} {_money(a['amount_minor'], a['currency']):>16}"
        )
    return "\n".join(out)


def render_csv(doc: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for a in doc["allocations"]:
        writer.writerow(a)
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    from reconciler.service import pool, usages

    start, end = usages.default_window(dt.datetime.now(dt.UTC))
    if args.start:
        start = usages.parse_time(args.start, what="--from")
    if args.end:
        end = usages.parse_time(args.end, what="--to")
    readers = pool.Pool(db.reading_url(args), size=1)
    try:
        with readers.reading() as conn:
            doc = usages.usage(conn, start=start, end=end, tenant=args.tenant)
    finally:
        readers.close()
    if output.structured(args.output):
        output.emit(doc, args.output)
    elif args.output == "csv":
        print(render_csv(doc), end="")
    else:
        print(render_text(doc))
    return 0
