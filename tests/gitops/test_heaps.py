"""The watch loop's heap (`reconciler.loop.heaps`): a revision's own cycles freed at once, frozen
ones only by a full collection, and that only once due and idle."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from reconciler.loop import heaps


class Node:
    """A self-referencing object: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the session collects as usual


def test_a_revisions_own_cycles_are_freed_when_it_settles() -> None:
    heap = heaps.Heap()
    heap.settle()
    gone = Node()
    ref = weakref.ref(gone)
    del gone
    heap.settle()
    assert ref() is None and heap.young_collections == 2 and not heap.due


def test_frozen_garbage_waits_for_a_full_collection_when_due_and_idle() -> None:
    now = [0.0]
    heap = heaps.Heap(lambda: now[0], growth=0.0, idle_s=2.0)
    heap.settle()
    kept = Node()
    ref = weakref.ref(kept)
    heap.settle()  # `kept` lives on: frozen, and the frozen heap grew
    assert heap.due
    del kept  # now garbage, but frozen: the young collection of the next revision does not walk it
    heap.settle()
    assert ref() is not None
    now[0] += 1.0
    assert not heap.idle() and ref() is not None  # a revision came 1 s ago: not idle yet
    now[0] += 1.5
    assert heap.idle() and ref() is None
    assert not heap.due and heap.full_collections == 1
    assert not heap.idle()  # nothing due: no second full walk


def test_a_large_build_is_frozen_as_it_is_and_collected_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heaps, "YOUNG_MAX", -1)  # any young generation counts as a cold build's
    now = [0.0]
    heap = heaps.Heap(lambda: now[0], idle_s=1.0)
    built = Node()
    ref = weakref.ref(built)
    del built
    heap.settle()
    assert heap.young_collections == 0 and heap.due and ref() is not None
    now[0] += 1.0
    assert heap.idle() and ref() is None
