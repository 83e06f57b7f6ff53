"""Inventory sync, the writing half: the rows a sync decided to write, and the statuses that follow them.

New rows go in by COPY when there are many (a cold sync), one INSERT each
otherwise; changed and removed rows by key. store/inventory.py decides what
to write (it compares); nothing here reads a row to decide.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from typing import Any

from psycopg import sql

from desired.state import DesiredState
from reconciler.store import inventoryrows
from reconciler.store.connections import Connection
from reconciler.store.inventoryrows import FLEET, JsonText, Row, Table


def _jsonb(value: Any) -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb(value)


def plain_json(value: Any) -> Any:
    """What jsonb gives back: string keys only (e.g. workload_mix {1: 0.4} -> {"1": 0.4})."""
    if isinstance(value, JsonText):
        return json.loads(value)
    return json.loads(json.dumps(value))


def compared(table: Table, row: Row) -> tuple[Any, ...]:
    """The desired columns of `row` as the table gives them back (JSON parsed, addresses typed)."""
    return tuple(
        plain_json(row[c])
        if c in table.json_columns
        else ipaddress.ip_address(row[c])
        if c in table.inet_columns
        else row[c]
        for c in table.columns
    )


def _json_param(value: Any) -> Any:
    # None stays SQL NULL (an optional JSON column such as nvme_identity), not JSON null.
    if value is None:
        return None
    return _jsonb(json.loads(value) if isinstance(value, JsonText) else value)


def _params(table: Table, row: Row, revision: str) -> Row:
    out = {k: _json_param(v) if k in table.json_columns else v for k, v in row.items()}
    out["revision"] = revision
    return out


def same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


COPY_FROM = 50  # new rows written by COPY from this many on (fewer: one INSERT each, no COPY set-up)


def copy_rows(conn: Connection, table: Table, rows: Iterable[Row], *, revision: str) -> int:
    """COPY new rows into `table` as they come (an iterator: the server stores rows while the caller
    builds the next); how many were written."""
    every = (*table.key, *table.columns)
    stmt = sql.SQL("COPY {name} ({cols}, present, revision) FROM STDIN").format(
        name=sql.Identifier(table.name), cols=sql.SQL(", ").join(map(sql.Identifier, every))
    )
    json_at = [i for i, c in enumerate(every) if c in table.json_columns]
    array_at: list[int] | None = None
    n = 0
    with conn.cursor().copy(stmt) as copy:
        for r in rows:
            values = [r[c] for c in every]
            if array_at is None:  # a builder's column holds a list in every row: found in the first
                array_at = [i for i, v in enumerate(values) if i not in json_at and type(v) is list]
            for i in json_at:  # JSON text (JsonText) goes as it is
                if values[i] is not None and not isinstance(values[i], str):
                    values[i] = _jsonb(values[i])
            for i in array_at:
                if type(values[i]) is list:
                    values[i] = _array_literal(values[i])
            copy.write_row((*values, True, revision))
            n += 1
    return n


def write_rows(
    conn: Connection,
    table: Table,
    inserts: list[Row],
    updates: list[Row],
    gone: list[tuple[Any, ...]],
    *,
    revision: str,
) -> None:
    name = sql.Identifier(table.name)
    every = (*table.key, *table.columns)
    if len(inserts) >= COPY_FROM:  # a cold sync: one COPY instead of a statement per row
        copy_rows(conn, table, inserts, revision=revision)
        inserts = []
    if inserts:
        stmt = sql.SQL("INSERT INTO {name} ({cols}, present, revision) VALUES ({vals}, true, %(revision)s)").format(
            name=name,
            cols=sql.SQL(", ").join(map(sql.Identifier, every)),
            vals=sql.SQL(", ").join(sql.Placeholder(c) for c in every),
        )
        conn.cursor().executemany(stmt, [_params(table, r, revision) for r in inserts])
    if updates:
        stmt = sql.SQL(
            "UPDATE {name} SET {sets}, present = true, revision = %(revision)s, updated_at = now() WHERE {where}"
        ).format(
            name=name,
            sets=sql.SQL(", ").join(
                sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder(c)) for c in table.columns
            ),
            where=sql.SQL(" AND ").join(
                sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in table.key
            ),
        )
        conn.cursor().executemany(stmt, [_params(table, r, revision) for r in updates])
    if gone:
        stmt = sql.SQL(
            "UPDATE {name} SET present = false, revision = %(revision)s, updated_at = now() WHERE {where}"
        ).format(
            name=name,
            where=sql.SQL(" AND ").join(
                sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k)) for k in table.key
            ),
        )
        conn.cursor().executemany(
            stmt, [{**dict(zip(table.key, key, strict=True)), "revision": revision} for key in gone]
        )


def _array_literal(items: list[Any]) -> Any:
    """A list of text or numbers as PostgreSQL's array literal, which COPY passes on to the column's parser.

    psycopg's list dumper is Python code per element and was the largest part of formatting a
    cold sync's rows (text[] columns: tags, reasons); anything else goes to it unchanged.
    """
    parts = []
    for x in items:
        if isinstance(x, str):
            parts.append('"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif type(x) is int:
            parts.append(str(x))
        else:
            return items
    return "{" + ",".join(parts) + "}"


def generation(conn: Connection) -> int:
    """The inventory generation: moved by every sync that wrote (another writer moves it too)."""
    row = conn.execute("SELECT generation FROM inventory_generation").fetchone()
    return int(row[0]) if row else 0


def bump_generation(conn: Connection) -> int:
    row = conn.execute("UPDATE inventory_generation SET generation = generation + 1 RETURNING generation").fetchone()
    return int(row[0]) if row else 0


def slot_statuses(conn: Connection, keys: Sequence[tuple[Any, ...]] | None) -> None:
    """A free slot git no longer offers is disabled; one offered again is available.

    `keys`: the (node id, slot index) of the slot rows this sync wrote, the
    only ones whose `present`/`enabled` can have changed (every other writer
    of a free status keeps it in step with them: schemas/sql 0004, 0011);
    found by the (node_id, slot_index) unique index. None (a full sync, no
    trusted memory): every free slot is looked at, in one scan.
    """
    if keys is not None:
        if keys:
            conn.execute(
                "UPDATE node_resource_slots s SET status = CASE WHEN s.present AND s.enabled"
                " THEN 'available' ELSE 'disabled' END, updated_at = now()"
                " FROM unnest(%s::uuid[], %s::integer[]) k (node_id, slot_index)"
                " WHERE s.node_id = k.node_id AND s.slot_index = k.slot_index"
                " AND s.status IN ('available', 'disabled') AND (s.status = 'available') <> (s.present AND s.enabled)",
                ([k[0] for k in keys], [k[1] for k in keys]),
            )
        return
    conn.execute(
        "UPDATE node_resource_slots SET status = CASE WHEN present AND enabled THEN 'available' ELSE 'disabled' END,"
        " updated_at = now() WHERE status IN ('available', 'disabled')"
        " AND (status = 'available') <> (present AND enabled)"
    )


def sync_fleet(conn: Connection, state: DesiredState, revision: str) -> str | None:
    """Write the fleet settings row if it differs: "added", "changed", or None (nothing written)."""
    fleet = state.fleet
    if fleet is None:
        return None
    row = inventoryrows.fleet_row(fleet)
    cols = FLEET.columns
    have = conn.execute(
        sql.SQL("SELECT {} FROM fleet_settings").format(sql.SQL(", ").join(map(sql.Identifier, cols)))
    ).fetchone()
    plain = tuple(plain_json(row[c]) if c in FLEET.json_columns and row[c] is not None else row[c] for c in cols)
    if have is not None and same(tuple(have), plain):
        return None
    conn.execute(
        sql.SQL(
            "INSERT INTO fleet_settings (singleton, {cols}, revision) VALUES (true, {values}, %(revision)s)"
            " ON CONFLICT (singleton) DO UPDATE SET {updates}, revision = EXCLUDED.revision, updated_at = now()"
        ).format(
            cols=sql.SQL(", ").join(map(sql.Identifier, cols)),
            values=sql.SQL(", ").join(map(sql.Placeholder, cols)),
            updates=sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in cols
            ),
        ),
        _params(FLEET, row, revision),
    )
    return "added" if have is None else "changed"
