"""What a parse worker sends back for a chunk of files: plain values, not pydantic's pickling of its models.

A worker reads, types and validates every document (validation happens
there, once); what crosses the pipe is, per file, plain tuples: each
document's index, line, plain value and problems, and its model as its
class and the fields it was validated with. pydantic's own pickling makes
and reads back a state dict per model in Python code on both sides;
here a model reduces to `(class, fields, fields set)` and is made again
in this process by `_model`, without validating a second time (the worker
did). Problems go as tuples too, not as dataclass instances.

The reduction is registered with multiprocessing's own pickler (the pipe's),
so nothing here pickles; `_model` still refuses anything but a
desired-state model class with a dict of fields and a set of field names.
"""

from __future__ import annotations

import functools
from multiprocessing import reduction
from typing import Any

from desired import problems as p

# A problem as it crosses the pipe: code, message, line, column, severity (the file is the caller's).
Sent = tuple[str, str, int, int, p.Severity]
# One document: index in its file, line, plain value (None: not wanted), model (None: refused), problems.
SentDoc = tuple[int, int, Any, Any, tuple[Sent, ...]]
# One file: its documents and the reader's problems (both None: they are in the cache's pack), its bytes
# compressed (None: not wanted).
SentFile = tuple[tuple[SentDoc, ...] | None, tuple[Sent, ...] | None, bytes | None]


def sent(problems: list[p.Problem]) -> tuple[Sent, ...]:
    return tuple((x.code, x.message, x.line, x.column, x.severity) for x in problems)


def received(found: tuple[Sent, ...], name: str) -> list[p.Problem]:
    return [p.Problem(code, message, name, line, col, severity) for code, message, line, col, severity in found]


def _model(cls: Any, values: Any, fields_set: Any) -> Any:
    """A desired-state model from the fields a worker validated it with, not validated again."""
    if not (cls in _model_classes() and type(values) is dict and type(fields_set) is set):
        raise TypeError(f"{cls!r}: not a desired-state model's fields")
    obj = cls.__new__(cls)
    setattr_ = object.__setattr__
    setattr_(obj, "__dict__", values)
    setattr_(obj, "__pydantic_fields_set__", fields_set)
    setattr_(obj, "__pydantic_extra__", None)  # extra fields are forbidden
    setattr_(obj, "__pydantic_private__", None)  # the models hold no private attributes
    return obj


@functools.cache
def _model_classes() -> frozenset[type]:
    """Every pydantic model class `desired.models` defines (the only ones a worker sends)."""
    from pydantic import BaseModel

    from desired import models

    return frozenset(
        obj
        for obj in vars(models).values()
        if models.defined_here(obj) and isinstance(obj, type) and issubclass(obj, BaseModel)
    )


def _reduce(obj: Any) -> tuple[Any, ...]:
    return _model, (type(obj), obj.__dict__, obj.__pydantic_fields_set__)


def _register() -> None:
    """The pool's pickler (multiprocessing's, in the worker) sends a model as `_reduce` says."""
    for cls in _model_classes():
        reduction.ForkingPickler.register(cls, _reduce)


_register()  # on import: in the fork server (preloaded with the pool), so in every worker
