"""`reconciler.caches.lazymap.LazyMap`: a dict's answers, each value loaded once, on first read."""

from __future__ import annotations

import pickle

from reconciler.caches.lazymap import LazyMap


def _table(keys: list[str]) -> tuple[LazyMap[str, object], list[str]]:
    """A table whose loader gives one object per key (memoized, as the contract asks) and logs each load."""
    made: dict[str, object] = {}
    loads: list[str] = []

    def load(key: str) -> object:
        loads.append(key)
        return made.setdefault(key, {"name": key})

    return LazyMap(keys, load), loads


def test_keys_order_and_membership_load_nothing() -> None:
    table, loads = _table(["b", "a", "c"])
    assert list(table) == ["b", "a", "c"] and len(table) == 3
    assert "a" in table and "z" not in table
    assert table.keys() & {"a", "z"} == {"a"}
    assert table.keys() == {"a", "b", "c"}
    assert loads == [] and table.loaded() == 0


def test_a_value_is_loaded_once_and_get_misses_cleanly() -> None:
    table, loads = _table(["a", "b"])
    first = table["a"]
    assert table["a"] is first and table.get("a") is first
    assert table.get("z") is None
    assert loads == ["a"] and table.loaded() == 1


def test_a_copy_shares_loaded_objects_and_is_edited_alone() -> None:
    table, loads = _table(["a", "b", "c"])
    a = table["a"]
    copy = table.copy()
    assert copy["a"] is a and copy["b"] is table["b"]  # one object per key across copies
    copy["d"] = "new"
    del copy["c"]
    assert list(copy) == ["a", "b", "d"] and list(table) == ["a", "b", "c"]
    assert loads == ["a", "b", "b"]  # each table asks the (memoizing) loader for b once


def test_equality_items_and_pickle_are_those_of_the_dict() -> None:
    table, _ = _table(["a", "b"])
    plain = {"a": {"name": "a"}, "b": {"name": "b"}}
    assert table == plain and plain == table
    assert dict(table.items()) == plain and list(table.values()) == list(plain.values())
    restored = pickle.loads(pickle.dumps(table))  # noqa: S301 - our own bytes
    assert type(restored) is dict and restored == plain
    assert table != {"a": {"name": "a"}}


def test_setting_a_key_keeps_its_place() -> None:
    table, loads = _table(["a", "b", "c"])
    table["b"] = "set"
    assert list(table.items())[1] == ("b", "set")
    assert loads == ["a", "c"]  # items() loaded the others, never b
