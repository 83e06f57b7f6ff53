"""The GitOps loop's values: the events it reports, its failure state, and the Protocol of the revisions it follows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Event:
    """One thing the loop did (for the log line, and for tests)."""

    kind: str  # applied | invalid | behind | skipped | retried | migrated | error
    revision: str | None
    message: str = ""
    run_id: int | None = None
    counts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    seconds: float = 0.0
    changed: bool = False

    def render(self) -> str:
        rev = (self.revision or "-")[:12]
        counts = " ".join(f"{k}={v}" for k, v in self.counts.items() if v)
        took = f" in {self.seconds:.2f}s" if self.seconds else ""
        text = f"{self.kind:<8} {rev:<12}{took}"
        if self.kind in ("applied", "retried"):
            text += " changed" if self.changed else " unchanged"
        return " ".join(x for x in (text, counts, self.message) if x)


class Revisions(Protocol):
    label: str

    def current(self) -> str | None:
        """The revision to be in force now (None: nothing committed yet)."""

    def wait(self, timeout: float) -> None:
        """Return when a new revision may exist, after `timeout` seconds, or when the loop stops."""

    def is_ancestor(self, older: str, newer: str) -> bool:
        """Is `older` an ancestor of `newer` (both known locally)? False when unknown."""

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Failing:
    """The loop has failed since `since` (its clock); the newest failure is `code` on `revision`."""

    revision: str | None
    code: str
    message: str
    since: float
    tries: int  # failures in a row of this code on this revision
