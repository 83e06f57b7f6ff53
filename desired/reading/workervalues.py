"""What a parse worker sends back for a chunk of files: plain values, not pydantic's pickling of its models.

A worker reads, types and validates every document (validation happens
there, once); what crosses the pipe is, per file, plain tuples: each
document's index, line, plain value and problems, and its model as its
class and the fields it was validated with. pydantic's own pickling makes
and reads back a state dict per model in Python code on both sides;
here a model reduces to `(class, fields, fields set)` and is made again
in this process by `modelfields.rebuild`, without validating a second time (the worker
did). Problems go as tuples too, not as dataclass instances.

The reduction is registered with multiprocessing's own pickler (the pipe's),
so nothing here pickles; `modelfields.rebuild` still refuses anything but a
desired-state model class with a dict of fields and a set of field names.
"""

from __future__ import annotations

from multiprocessing import reduction
from typing import Any

from desired import problems as p
from desired.reading import modelfields

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


def _reduce(obj: Any) -> tuple[Any, ...]:
    return modelfields.rebuild, modelfields.fields(obj)


def _register() -> None:
    """The pool's pickler (multiprocessing's, in the worker) sends a model as `_reduce` says."""
    for cls in modelfields.model_classes():
        reduction.ForkingPickler.register(cls, _reduce)


_register()  # on import: in the fork server (preloaded with the pool), so in every worker
