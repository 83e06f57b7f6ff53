"""A table whose keys are known and whose values are built on first read.

A PR plan's kept base (`reconciler.caches.keptworlds`) holds every slot map
of the fleet, most of its models, and a change to one allocation reads none
of them: building them all would be most of the plan. Its tables are LazyMaps
instead: every key is there in order, and a value is loaded the first time
someone reads it. Anything that walks the values (a full validation, a slot
map edit copying the table) loads them all, and gets what a plain dict would
have given: laziness only moves the cost, it never changes an answer.

`load` must give the same object for the same key every time (the loader
memoizes): copies share it, so a base and the head built from it by delta
hold one model per document, as two dicts sharing values would, and code
that compares models by identity (`replanning`, `validationmemo`) sees no change
where there is none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, KeysView, MutableMapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_UNSET: Any = object()


class LazyMap(MutableMapping[K, V]):
    """A dict-like table (insertion order, copy, equality) that loads each value on first read."""

    __slots__ = ("_data", "_load")

    def __init__(self, keys: Iterable[K], load: Callable[[K], V]) -> None:
        self._data: dict[K, Any] = dict.fromkeys(keys, _UNSET)
        self._load = load

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        if value is _UNSET:
            value = self._data[key] = self._load(key)
        return value  # type: ignore[no-any-return]

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = value

    def __delitem__(self, key: K) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> KeysView[K]:
        return self._data.keys()  # dict_keys: set operations at C speed, no value loaded

    def copy(self) -> LazyMap[K, V]:
        """A new table with the same entries (loaded or not) and the same loader."""
        out: LazyMap[K, V] = LazyMap((), self._load)
        out._data = dict(self._data)
        return out

    def loaded(self) -> int:
        """How many values were read so far (a test sees what a plan had to load)."""
        return sum(1 for v in self._data.values() if v is not _UNSET)

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self.items()),)  # pickled as the plain dict it stands for

    def __repr__(self) -> str:
        return f"LazyMap({len(self._data)} keys, {self.loaded()} loaded)"
