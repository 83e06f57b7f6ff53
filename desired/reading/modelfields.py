"""A desired-state model made again from the fields it was validated with, without validating again.

Models cross processes (a parse worker's results, `workervalues`) and files
(the parse cache's packs, `reconciler.caches.blobpacks`) as their class, a
dict of fields and the set of fields given. Rebuilding one that way skips
pydantic's per-model Python in pickling; it is safe only for what was
validated before it was sent, and only for the classes `desired.models`
defines, so anything else is refused.
"""

from __future__ import annotations

import functools
from typing import Any


def rebuild(cls: Any, values: Any, fields_set: Any) -> Any:
    """The model of class `cls` holding `values`; TypeError when they are not a desired-state model's fields."""
    if not (cls in model_classes() and type(values) is dict and type(fields_set) is set):
        raise TypeError(f"{cls!r}: not a desired-state model's fields")
    obj = cls.__new__(cls)
    setattr_ = object.__setattr__
    setattr_(obj, "__dict__", values)
    setattr_(obj, "__pydantic_fields_set__", fields_set)
    setattr_(obj, "__pydantic_extra__", None)  # extra fields are forbidden
    setattr_(obj, "__pydantic_private__", None)  # the models hold no private attributes
    return obj


def fields(obj: Any) -> tuple[Any, Any, Any]:
    """What `rebuild` makes `obj` again from: its class, fields and fields given."""
    return type(obj), obj.__dict__, obj.__pydantic_fields_set__


@functools.cache
def model_classes() -> frozenset[type]:
    """Every pydantic model class `desired.models` defines."""
    from pydantic import BaseModel

    from desired import models

    return frozenset(
        obj
        for obj in vars(models).values()
        if models.defined_here(obj) and isinstance(obj, type) and issubclass(obj, BaseModel)
    )
