"""How a kept base world is pickled and read back (`reconciler.caches.keptworlds` frames and keeps it).

A world is half a million objects; this module picks the forms the loader
reads back quickest (a pydantic model's fields set without validation, a
slotted dataclass through its own __init__, a named tuple built by
`tuple.__new__` in C, equal tuples of plain values pickled once) and the
unpickler that reads them: it knows only the classes a world is made of,
`_model` and `_proxy`, a few builtins, and `getattr` for `tuple.__new__`
alone. Anything else is refused (the world is a miss).
"""

from __future__ import annotations

import copyreg
import dataclasses
import enum
import functools
import io
import pickle
import types
import zlib
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from typing import Any

from pydantic import BaseModel

from desired.reading.yamlio import Document

# The types a world is made of, by name: each a data type defined in that module of this project
# (checked on use: a name a module merely imports, such as `desired.reading.safefiles.Path`, is never taken).
# `desired.models`' pydantic models and enums are admitted as a family (`_model_classes`), and
# `_model` and `_proxy` below are the only callables besides these types. Anything else is a miss.
_TYPES: dict[str, frozenset[str]] = {
    m: frozenset(names.split())
    for m, names in {
        "desired.state": "DesiredState Source",
        "desired.reading.documents": "Blob",
        "desired.reading.yamlio": "Document",
        "desired.problems": "Problem Severity",
        "policies.capability": "Capability CapabilityVerdict",
        "policies.eligibility": "Ineligible",
        "policies.fabric": "Mismatch",
        "policies.packing": "Demand Option Policy",
        "policies.topology": "Choice Layout",
        "reconciler.plans": "Candidate ExistingClaim Observed Pending Placement Release",
        "reconciler.placement.fleetgraph": "NodeFacts SlotFacts",
        "reconciler.placement.inventory_diff": "CapabilityChange DocumentChange FieldChange InventoryDiff SlotChange",
        "reconciler.placement.placing": "Engine",
        "reconciler.placement.requests": "Placed Request Spec Specs Tier",
        "reconciler.placement.fleetstate": "FleetState Node",
        "reconciler.placement.picking": "Picker",
        "reconciler.placement.strategies": "Buckets ByEnd Interleaved Patterns",
        "reconciler.placement.explaining": "Explainer",
        "reconciler.placement.counting": "FitCounter",
        "reconciler.placement.index": "EndOrder NodeHeap SliceIndex WholeNodeIndex",
        "reconciler.placement.capacity": "Blocked Memo NodeSummary Offer ReadModel Size",
        "reconciler.placement.prplan": "BaseSide CapacityChange NodeChange",
        "reconciler.placement.reasons": "Refused",
        "schemas.states": "ClaimKind ClaimStatus SlotStatus",
        "schemas.snapshots": "Profile",
    }.items()
}
_BUILTINS = frozenset({"set", "frozenset", "slice", "tuple"})
_DATETIME = frozenset({"datetime", "date", "timezone", "timedelta"})

_NEWOBJ = copyreg.__newobj__  # type: ignore[attr-defined]  # pickle's NEWOBJ (typeshed does not list it)


class Leak(Exception):
    """A model the world keeps lazily was reached from what it keeps eagerly (it would be two objects)."""


def _is_model_module(module: str) -> bool:
    """A module of the desired-state models package (`desired.models.nodes`, ...)."""
    return module.startswith("desired.models.")


_MODELS_SEEN: set[type] = set()  # classes `_model` has checked: 10,000 nodes are checked once
_setattr = object.__setattr__


def _model(cls: Any, values: dict[str, Any], fields_set: set[str], extra: Any, private: Any) -> Any:
    """A pydantic model from its stored fields, without validation (pickle's way, in fewer steps)."""
    if cls not in _MODELS_SEEN:
        if not (_is_model_module(getattr(cls, "__module__", "")) and issubclass(cls, BaseModel)):
            raise pickle.UnpicklingError(f"{cls!r} is not a desired-state model")
        _MODELS_SEEN.add(cls)
    obj = cls.__new__(cls)
    setattr_ = _setattr
    setattr_(obj, "__dict__", values)
    setattr_(obj, "__pydantic_fields_set__", fields_set)
    setattr_(obj, "__pydantic_extra__", extra)
    setattr_(obj, "__pydantic_private__", private)
    return obj


def _proxy(values: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(values)


def dumps(value: Any, *, refuse: AbstractSet[int] = frozenset(), intern: Callable[[Any], Any] | None = None) -> bytes:
    return dumper(refuse=refuse, intern=intern)(value)


def dumper(
    *, refuse: AbstractSet[int] = frozenset(), intern: Callable[[Any], Any] | None = None
) -> Callable[[Any], bytes]:
    """What pickles values one after another with one dispatch table (a kept base pickles 20,000 files)."""
    # A dispatch table, not reducer_override: the pickler asks it only about objects of these exact
    # types, where reducer_override was called for every one of half a million objects.
    table = _reducers(refuse, intern or interner())

    def dump(value: Any) -> bytes:
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.dispatch_table = table
        pickler.dump(value)
        return out.getvalue()

    return dump


def interner() -> Callable[[Any], Any]:
    """What gives one object for every equal tuple of plain values (other values pass as they are).

    A 10,000-node world holds a third of a million tuples, two in three
    of them equal to another (`(True, ())` for every eligible slot, the same
    tags and profiles on every node): pickled once each and read back as
    references, they cost the loader nothing. Only tuples of atoms (strings,
    numbers, None, enum members, such tuples) are merged, and equal means by
    value and by type all the way down: `(1,)` never stands for `(True,)` or
    `(1.0,)`, and two equal models or engine objects are never made one.
    Frozen value classes of atoms (`_value_classes`: a node's capability
    verdict, one of a handful on 10,000 nodes) are merged the same way.
    """
    seen: dict[Any, Any] = {}
    values = _value_classes()

    def intern(value: Any) -> Any:
        kind = type(value)
        try:
            if kind is tuple:
                return seen.setdefault((value, _types(value)), value)
            if kind in values:
                fields = tuple(getattr(value, name) for name in values[kind])
                return seen.setdefault((kind, fields, _types(fields)), value)
        except (TypeError, _NotPlain):  # holds something other than atoms: kept as it is
            pass
        return value

    return intern


@functools.cache
def _value_classes() -> dict[type, tuple[str, ...]]:
    """Frozen dataclasses a world holds many equal copies of, which nothing tells apart but by value."""
    from policies.capability import CapabilityVerdict

    return {CapabilityVerdict: tuple(f.name for f in dataclasses.fields(CapabilityVerdict))}


def as_is(value: Any) -> Any:
    """The interner that merges nothing (for parts read rarely: interning costs at dump time)."""
    return value


class _NotPlain(Exception):
    pass


_ATOMS = frozenset({str, int, float, bool, bytes, type(None)})


def _types(value: Any) -> Any:
    """The type of every leaf of a tuple of atoms, in its shape; _NotPlain for anything else."""
    kind = type(value)
    if kind is tuple:
        return tuple(_types(x) for x in value)
    if kind in _ATOMS or isinstance(value, enum.Enum):  # an enum member is one object already
        return kind
    raise _NotPlain


def _reducers(refuse: AbstractSet[int], intern: Callable[[Any], Any]) -> dict[type, Callable[[Any], Any]]:
    """How a world's objects are pickled, in the forms `_Unpickler` reads back quickest."""
    packed: dict[int, bytes] = {}  # id(raw bytes) -> compressed: a file's documents share one

    def model(obj: Any) -> Any:
        if id(obj) in refuse:
            raise Leak(f"{type(obj).__name__} {getattr(obj, 'node', '')!r} is reached eagerly")
        return _model, (
            type(obj),
            {name: intern(value) for name, value in obj.__dict__.items()},
            obj.__pydantic_fields_set__,
            obj.__pydantic_extra__,
            obj.__pydantic_private__,
        )

    def document(obj: Any) -> Any:
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if not obj.packed:
            raw = obj.data
            data = packed.get(id(raw))
            if data is None:
                data = packed[id(raw)] = zlib.compress(raw, 1)
            fields.update(data=data, packed=True)
        # copyreg.__newobj__ is pickle's own NEWOBJ, and a (None, slots) state is set at C speed (no
        # Python call per document); a composed node tree is dropped (composed again when asked)
        return _NEWOBJ, (Document,), (None, {**fields, "_node": None})

    def plain(obj: Any) -> Any:
        # A slotted dataclass is pickled through dataclasses' Python __setstate__ (fields() on
        # every object, slow); its own __init__ takes the same fields positionally.
        return type(obj), tuple(intern(getattr(obj, f.name)) for f in dataclasses.fields(obj))

    def named(obj: Any) -> Any:
        # `tuple.__new__(SlotFacts, fields)` builds it in C; pickle's own way calls the named tuple's
        # Python __new__, for 80,000 slots of a 10,000-node world (an eighth of the load)
        return _TUPLE_NEW, (type(obj), tuple(obj))

    table: dict[type, Callable[[Any], Any]] = dict.fromkeys(_model_classes(), model)
    table.update(dict.fromkeys(_named_tuples(), named))
    table.update(dict.fromkeys(_plain_dataclasses(), plain))
    table[types.MappingProxyType] = lambda obj: (_proxy, (dict(obj),))
    table[Document] = document
    return table


@functools.cache
def _model_classes() -> tuple[type, ...]:
    from desired import models

    return tuple(v for v in vars(models).values() if models.defined_here(v) and issubclass(v, BaseModel))


_TUPLE_NEW = tuple.__new__  # pickled as getattr(tuple, "__new__"): the one getattr `_attribute` gives


def _attribute(owner: Any, name: str) -> Any:
    """The unpickler's `getattr`: only `tuple.__new__`, what the named tuples of a world are built with."""
    if owner is tuple and name == "__new__":
        return _TUPLE_NEW
    raise pickle.UnpicklingError(f"getattr({owner!r}, {name!r}) is not allowed in a kept base")


@functools.cache
def _named_tuples() -> frozenset[type]:
    from reconciler.placement import fleetgraph

    return frozenset({fleetgraph.SlotFacts})


@functools.cache
def _plain_dataclasses() -> frozenset[type]:
    """Slotted dataclasses a world holds whose __init__ takes exactly their fields (no __post_init__)."""
    from desired.reading.documents import Blob
    from desired.state import Source
    from policies.capability import CapabilityVerdict
    from reconciler import plans
    from reconciler.placement import fleetgraph

    return frozenset({Source, Blob, fleetgraph.NodeFacts, CapabilityVerdict, plans.ExistingClaim})


# ------------------------------------------------------------------ reading


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name in ("_model", "_proxy"):
            return globals()[name]
        if module == "builtins" and name == "getattr":
            return _attribute
        if module == "builtins" and name in _BUILTINS:
            import builtins

            return getattr(builtins, name)
        if module == "datetime" and name in _DATETIME:
            import datetime

            return getattr(datetime, name)
        found = _allowed(module, name)
        if found is not None:
            return found
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a kept base")


@functools.cache
def _allowed(module: str, name: str) -> type | None:
    """The type `module.name` when the allow-list names it and that module defines it (not imports it)."""
    if _is_model_module(module):
        return next(
            (c for c in _model_classes() + _model_enums() if c.__name__ == name and c.__module__ == module), None
        )
    if name not in _TYPES.get(module, ()):
        return None
    import importlib

    found = getattr(importlib.import_module(module), name, None)
    return found if isinstance(found, type) and found.__module__ == module else None


@functools.cache
def _model_enums() -> tuple[type, ...]:
    import enum

    from desired import models

    return tuple(v for v in vars(models).values() if models.defined_here(v) and issubclass(v, enum.Enum))


def loads(data: bytes | memoryview) -> Any:
    return _Unpickler(io.BytesIO(data)).load()


def load(file: Any) -> Any:
    """The value pickled at `file`'s position (a mapped kept base: read frame by frame, never copied whole)."""
    return _Unpickler(file).load()
