"""Build every desired-state model's validator now: imported by the parse pool's fork server only.

The models defer building their validators (`defer_build`): a command that
reads a kept base (`reconciler.caches.keptworlds`) validates one or two
documents and should not pay for building every validator at import. A
parse worker validates thousands, so the fork server builds them once,
before it forks: every worker starts with them built.
"""

from __future__ import annotations

from pydantic import BaseModel

from desired import models


def build_all() -> int:
    """Build the validator of every model in `desired.models`; how many were built."""
    built = 0
    for value in vars(models).values():
        if models.defined_here(value) and issubclass(value, BaseModel):
            value.model_rebuild(force=True)
            built += 1
    return built


build_all()
