"""Incremental inventory sync equals a full sync (issue 10).

A `Memory` keeps the rows its last sync wrote, keyed by the documents they
came from. Over random edit sequences (nodes drained and restored, slots
disabled, allocations added, released and removed, nodes removed and
re-added, the fleet settings changed), after every incremental sync a full
sync finds nothing left to write and the tables equal a fresh full sync's.
Another reconciler writing in between makes the memory re-read everything.
With the Delta of each state (as `desired.reading.deltas` gives the watch loop), only
the changed documents are itemised; the outcome and the content hash are
the same.
"""

from __future__ import annotations

import copy
import random
import weakref

import pytest

from desired import models as m
from desired.state import Delta, DesiredState
from reconciler.store import inventory, inventoryrows
from reconciler.store.connections import Connection
from tests.claims.conftest import small_fleet
from tests.claims.test_inventory import snapshot


def _edit(rng: random.Random, state: DesiredState, spare: DesiredState) -> DesiredState:
    """A new revision: a shallow copy sharing every unchanged document object (as the blob cache does)."""
    new = copy.copy(state)
    new.nodes, new.slot_maps, new.allocations = dict(state.nodes), dict(state.slot_maps), dict(state.allocations)
    new.revision = f"rev-{rng.randrange(1 << 30)}"
    what = rng.random()
    name = rng.choice(sorted(spare.nodes))
    if what < 0.2 and name in new.nodes:
        node = new.nodes[name]
        state_now = m.AdminState.DRAINING if node.admin_state is m.AdminState.ACTIVE else m.AdminState.ACTIVE
        new.nodes[name] = node.model_copy(update={"admin_state": state_now})
    elif what < 0.35 and name in new.slot_maps:
        smap = new.slot_maps[name]
        i = rng.randrange(len(smap.slots))
        slots = list(smap.slots)
        slots[i] = slots[i].model_copy(update={"enabled": not slots[i].enabled})
        new.slot_maps[name] = smap.model_copy(update={"slots": tuple(slots)})
    elif what < 0.5:
        aid = rng.choice(sorted(spare.allocations))
        if aid in new.allocations:
            del new.allocations[aid]
        else:
            new.allocations[aid] = spare.allocations[aid]
    elif what < 0.65 and new.allocations:
        aid = rng.choice(sorted(new.allocations))
        a = new.allocations[aid]
        flip = m.AllocationState.RELEASED if a.state is m.AllocationState.PRESENT else m.AllocationState.PRESENT
        new.allocations[aid] = a.model_copy(update={"state": flip})
    elif what < 0.8:
        if name in new.nodes:
            del new.nodes[name]
            new.slot_maps.pop(name, None)
        else:
            new.nodes[name] = spare.nodes[name]
            if name in spare.slot_maps:
                new.slot_maps[name] = spare.slot_maps[name]
    elif new.fleet is not None:
        timeout = 300 if new.fleet.graceful_shutdown_timeout_s != 300 else 240
        new.fleet = new.fleet.model_copy(update={"graceful_shutdown_timeout_s": timeout})
    return new


def _delta(old: DesiredState, new: DesiredState) -> Delta:
    """`new` as `old` plus what differs (by object identity, as desired.reading.deltas returns it)."""
    keys = {("Fleet", new.fleet.name if new.fleet else "")} if new.fleet is not old.fleet else set()
    for kind, attr in (
        ("Sku", "skus"),
        ("Image", "images"),
        ("Node", "nodes"),
        ("SlotMap", "slot_maps"),
        ("Allocation", "allocations"),
    ):
        a, b = getattr(old, attr), getattr(new, attr)
        keys.update((kind, n) for n in a.keys() | b.keys() if a.get(n) is not b.get(n))
    return Delta(weakref.ref(old), frozenset(keys))


_OUT_OF_STEP = (
    "SELECT count(*) FROM node_resource_slots"
    " WHERE status IN ('available', 'disabled') AND (status = 'available') <> (present AND enabled)"
)


@pytest.mark.parametrize(("seed", "by_delta"), [(1, False), (2, False), (1, True), (3, True)])
def test_incremental_sync_equals_a_full_sync_after_every_edit(conn: Connection, seed: int, by_delta: bool) -> None:
    rng = random.Random(seed)  # noqa: S311 - test randomness
    spare = small_fleet()
    state = small_fleet()
    memory = inventory.Memory()
    inventory.sync(conn, state, memory=memory)
    trusted = 0
    for step in range(40):
        old, state = state, _edit(rng, state, spare)
        delta = _delta(old, state) if by_delta else None
        if step % 9 == 4:  # another reconciler syncs something else in between
            other = _edit(rng, state, spare)
            inventory.sync(conn, other)
        before = memory.full_syncs
        incremental = inventory.sync(conn, state, memory=memory, delta=delta)
        trusted += memory.full_syncs == before
        # The statuses of free slots follow their flags after the incremental sync already (it updates
        # only the slots it wrote; the full sync below would quietly mend any it missed).
        assert conn.execute(_OUT_OF_STEP).fetchone() == (0,), step
        full = inventory.sync(conn, state)  # a cold reconciler on the same state finds nothing to write
        assert not full.changed, (step, [c.render() for c in full.changes], [c.render() for c in incremental.changes])
        assert incremental.content_hash == inventoryrows.content_hash(state)
    assert trusted >= 30  # the incremental path really ran
    assert (memory.delta_syncs >= 20) is by_delta


def test_the_memory_is_dropped_when_its_transaction_fails(conn: Connection) -> None:
    state = small_fleet()
    memory = inventory.Memory()
    inventory.sync(conn, state, memory=memory)
    node = state.nodes["node-00001"]
    changed = copy.copy(state)
    changed.nodes = {**state.nodes, "node-00001": node.model_copy(update={"admin_state": m.AdminState.DRAINING})}
    changed.revision = "rev-fails"
    conn.execute("ALTER TABLE desired_revisions ADD CONSTRAINT no_rev_fails CHECK (revision <> 'rev-fails')")
    with pytest.raises(Exception, match="no_rev_fails"):
        inventory.sync(conn, changed, memory=memory)
    assert memory.generation is None  # nothing it learnt in the failed transaction is trusted
    changed.revision = "rev-2"
    result = inventory.sync(conn, changed, memory=memory)
    assert [c.render() for c in result.changes] == ["node node-00001 changed"]
    assert not inventory.sync(conn, changed).changed
    assert snapshot(conn)["nodes"]
