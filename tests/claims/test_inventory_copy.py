"""A cold sync's COPY formats arrays itself (`inventorywrites._array_literal`): what it stores is what was built."""

from __future__ import annotations

import pytest

from reconciler.store import inventorywrites
from reconciler.store.connections import Connection

AWKWARD = ["plain", 'say "hi"', "back\\slash", "a,b", "{braces}", "NULL", "", "tab\there", "new\nline", "é ✓"]


@pytest.mark.parametrize("items", [[], ["one"], AWKWARD, [1, 2, 4, 8]], ids=["empty", "one", "awkward", "ints"])
def test_an_array_literal_copies_back_to_the_same_list(conn: Connection, items: list[object]) -> None:
    kind = "integer[]" if items and isinstance(items[0], int) else "text[]"
    conn.execute(f"CREATE TEMP TABLE copied (v {kind})")
    try:
        with conn.cursor().copy("COPY copied (v) FROM STDIN") as copy:
            copy.write_row((inventorywrites._array_literal(items),))
        assert conn.execute("SELECT v FROM copied").fetchone() == (items,)
    finally:
        conn.execute("DROP TABLE copied")


def test_anything_else_is_left_to_psycopg() -> None:
    mixed: list[object] = [True, "x"]
    assert inventorywrites._array_literal(mixed) is mixed
