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


def _clock() -> tuple[list[float], heaps.Heap]:
    now = [0.0]
    return now, heaps.Heap(lambda: now[0], growth=0.5, idle_s=2.0, young_every=2)


def test_a_whole_read_is_frozen_as_it_is_and_collected_once_idle() -> None:
    now, heap = _clock()
    built = Node()
    ref = weakref.ref(built)
    del built
    heap.settle(whole=True)  # a cold build: collecting it would be the full walk
    assert heap.young_collections == 0 and heap.due and ref() is not None
    now[0] += 1.0
    assert not heap.idle() and ref() is not None  # applied 1 s ago: not idle yet
    now[0] += 1.5
    assert heap.idle() and ref() is None and heap.full_collections == 1
    assert not heap.due and not heap.idle()  # nothing due: no second full walk


def test_a_commits_own_cycles_are_freed_when_it_settles() -> None:
    now, heap = _clock()
    heap.settle(whole=True)
    now[0] += 3.0
    heap.idle()
    gone = Node()
    ref = weakref.ref(gone)
    del gone
    heap.settle(whole=False)  # young_every=2: the first commit's objects stay young, unfrozen
    assert ref() is not None and heap.young_collections == 0
    heap.settle(whole=False)
    assert ref() is None and heap.young_collections == 1 and not heap.due


def test_frozen_garbage_waits_until_enough_was_frozen_since() -> None:
    now, heap = _clock()
    heap.settle(whole=True)
    now[0] += 3.0
    heap.idle()
    assert heap.baseline is not None
    kept = Node()
    ref = weakref.ref(kept)
    heap.settle(whole=False)
    heap.settle(whole=False)  # `kept` lives on: frozen
    del kept  # now garbage, but frozen: the next commits' young collection does not walk it
    heap.settle(whole=False)
    heap.settle(whole=False)
    assert ref() is not None and not heap.due
    many = [Node() for _ in range(heap.baseline)]  # half the kept heap (growth=0.5) frozen since
    heap.settle(whole=False)
    heap.settle(whole=False)
    del many
    assert heap.due
    now[0] += 3.0
    assert heap.idle() and ref() is None and heap.frozen_since == 0
