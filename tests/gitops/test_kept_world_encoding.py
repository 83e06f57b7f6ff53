"""How a kept base is pickled (`reconciler.caches.worldpickle`): equal tuples once, slots built in C, nothing else.

The forms that make a world load faster must give back exactly the values
dumped (same types, same equality), and widen what the unpickler accepts by
nothing but `tuple.__new__`.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from desired import models as m
from desired.reading import documents
from policies import capability
from reconciler.caches import keptworlds, worldpickle
from reconciler.placement import capacity, fleetgraph, prplan
from schemas import states


def _slot(index: int) -> fleetgraph.SlotFacts:
    return fleetgraph.SlotFacts(
        index,
        "g0",
        None,
        0,
        "h200",
        f"0000:{index:02x}:00.0",
        m.Fabric.INFINIBAND,
        None,
        "/dev/nvme0n1",
        "",
        None,
        (),
        states.SlotStatus.AVAILABLE,
        True,
    )


def test_slot_facts_come_back_as_slot_facts() -> None:
    slots = (_slot(0), _slot(1))
    back = keptworlds._loads(worldpickle.dumps(slots))
    assert back == slots and all(type(s) is fleetgraph.SlotFacts for s in back)
    assert back[1].gpu_pci_address == "0000:01:00.0" and back[1].fabric is m.Fabric.INFINIBAND
    assert back[0].status is states.SlotStatus.AVAILABLE and back[0].host_blocked == ()


def test_equal_tuples_become_one_object_but_never_across_types() -> None:
    intern = worldpickle.interner()
    a, b = intern((True, ())), intern(tuple([True, ()]))
    assert a is b
    one, true, one_f = intern((1,)), intern((True,)), intern((1.0,))
    assert type(one[0]) is int and type(true[0]) is bool and type(one_f[0]) is float  # equal, yet kept apart
    assert intern(((1, "x"),)) is intern(tuple([(1, "x")]))
    assert intern(((1,),)) is not intern(((True,),))
    unhashable = ([1],)
    assert intern(unhashable) is unhashable  # passed through, not an error
    assert intern((m.Fabric.INFINIBAND, "x")) is intern(tuple([m.Fabric.INFINIBAND, "x"]))
    # equal objects that are not atoms (models, engine parts) stay apart: identity may mean something there
    model_a, model_b = m.Hugepages(), m.Hugepages()
    assert model_a == model_b and intern((model_a,)) is not intern(tuple([model_b]))


def test_equal_capability_verdicts_become_one_object_and_come_back_equal() -> None:
    """10,000 nodes hold a handful of distinct verdicts: each is pickled once, read back as references."""
    both = capability.Capability.BOTH_CAPABLE
    a, b = capability.CapabilityVerdict(both), capability.CapabilityVerdict(both)
    candidate = capability.Capability.SLICE_CANDIDATE
    why = capability.CapabilityVerdict(candidate, ((capability.NO_SLICE_TAG, "no slice tag"),))
    intern = worldpickle.interner()
    assert intern(a) is a and intern(b) is a and intern(why) is why
    assert intern(capability.CapabilityVerdict(candidate)) is not why  # other reasons: kept apart
    back = keptworlds._loads(worldpickle.dumps([intern(a), intern(b), why]))
    assert back == [a, b, why] and back[0] is back[1] and type(back[2]) is capability.CapabilityVerdict


class _Attr:
    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name = owner, name

    def __reduce__(self) -> tuple[Any, ...]:
        return getattr, (self.owner, self.name)


@pytest.mark.parametrize(("owner", "name"), [(tuple, "__add__"), (str, "join"), (tuple, "__class__")])
def test_the_unpickler_gives_no_other_attribute(owner: Any, name: str) -> None:
    data = pickle.dumps(_Attr(owner, name), protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(pickle.UnpicklingError, match="not allowed in a kept base"):
        keptworlds._loads(data)
    assert keptworlds.load(data, None) is None  # a world holding one is a miss, never an error


def test_a_file_names_the_cores_models_and_never_holds_one() -> None:
    """A file kept apart names each model the core keeps by (kind, name); any other path to one is refused."""
    sku = m.Sku.model_construct(sku="h200-slice")
    loose = m.Sku.model_construct(sku="not-in-the-core")
    blob = documents.Blob("skus.yaml", [], [("doc-a", sku, []), ("doc-b", loose, [])], 3)
    refer = {id(sku): ("Sku", "h200-slice")}
    docs, named, generation = worldpickle.loads(worldpickle.dumps(keptworlds._apart(blob, refer)))
    assert named == [(0, "Sku", "h200-slice")] and docs[0] == ("doc-a", None, []) and generation == 3
    assert docs[1][1] == loose and docs[1][1] is not loose
    with pytest.raises(worldpickle.Leak):  # the core's model reached another way would be two objects
        worldpickle.dumper(refuse=refer.keys())([("doc", None, [sku])])


def test_only_desired_state_models_are_built_without_validation() -> None:
    """`_model` builds a model of `desired.models` from stored fields; any other class is refused, every time."""
    built = worldpickle._model(m.Hugepages, dict(m.Hugepages().__dict__), set(), None, None)
    assert type(built) is m.Hugepages and built == m.Hugepages()
    for _ in range(2):  # a refusal is never remembered as a check passed
        with pytest.raises(pickle.UnpicklingError, match="not a desired-state model"):
            worldpickle._model(fleetgraph.NodeFacts, {}, set(), None, None)


def test_nodes_answered_alike_share_one_read_only_table_of_slots() -> None:
    """A kept side holds one table per distinct per-slot answer, not one dict per node, and none can be edited."""
    ok: dict[int, tuple[bool, tuple[str, ...]]] = {0: (True, ()), 1: (True, ())}
    side = prplan.BaseSide(
        pending={},
        offers=capacity.ReadModel(),
        memo=capacity.Memo(),
        schedulable={"a": dict(ok), "b": dict(ok), "c": {0: (True, ()), 1: (False, ("slot.no_vf",))}},
        modes={},
    )
    kept = keptworlds._loads(worldpickle.dumps(keptworlds._interned_side(side, worldpickle.interner())))
    assert kept.schedulable == side.schedulable
    assert kept.schedulable["a"] is kept.schedulable["b"] and kept.schedulable["c"] is not kept.schedulable["a"]
    with pytest.raises(TypeError):
        kept.schedulable["a"][0] = (False, ())  # type: ignore[index]
