"""A finished offline PR plan, kept for the next `gpuaas plan --offline` of the same two commits.

CI runs the plan of one PR many times over the same commits: a retried job,
a second output format (a markdown comment and a JSON artifact), the same
pair planned by a merge queue. An offline plan is a pure function of the
two commits, the folder planned, `--policy`, the output format and the code, so what the
command printed and the facts its exit status is made of are kept in the
blob cache's database (namespace `results`, `Store.put_record`) under a hash of all of them,
and replayed: no tree is read, nothing is planned.

The cache is never trusted, as the blob cache: its HMAC is checked before
the payload is parsed, the payload is JSON (plain values, never code) and
must have exactly the expected shape, and anything else is a miss that
plans from scratch. The code version is a hash of the source of every
package a plan runs through, so a changed planner never replays an old
answer. Not used online (the database is an input), with `--out` (the
saved plan needs the loaded head) or for a directory outside git.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reconciler.caches.blobpacks import DiskStore

FORMAT = 1
# Every package whose code can change a plan or how it prints.
_PACKAGES = ("desired", "policies", "reconciler", "schemas")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What `gpuaas plan` printed and what its exit status depends on."""

    printed: str  # stdout, exactly
    errors: int  # validation errors in head (nothing was planned)
    changed: bool
    new_pending: tuple[tuple[str, str], ...]  # (allocation id, code)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": FORMAT,
                "printed": self.printed,
                "errors": self.errors,
                "changed": self.changed,
                "new_pending": [list(x) for x in self.new_pending],
            }
        ).encode()


def decode(payload: bytes) -> Outcome | None:
    """The Outcome a payload holds, or None when it is not exactly what `encode` writes."""
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    if not (
        isinstance(value, dict)
        and set(value) == {"format", "printed", "errors", "changed", "new_pending"}
        and value["format"] == FORMAT
        and isinstance(value["printed"], str)
        and type(value["errors"]) is int
        and isinstance(value["changed"], bool)
        and isinstance(value["new_pending"], list)
    ):
        return None
    pending = []
    for item in value["new_pending"]:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            return None
        pending.append((item[0], item[1]))
    return Outcome(value["printed"], value["errors"], value["changed"], tuple(pending))


@functools.cache
def code_version() -> str:
    """A hash of every source file of the packages a plan runs through, and the library versions."""
    import pydantic
    import yaml

    h = hashlib.sha256(
        f"{FORMAT}\0{sys.version}\0{pydantic.VERSION}\0{yaml.__version__}\0"
        f"{getattr(yaml, '__with_libyaml__', False)}\0".encode()
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    for rel in sorted(rel for package in _PACKAGES for rel in _sources(root, package)):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _sources(root: str, folder: str) -> Iterator[str]:
    """Every `.py` file under `root/folder`, as a path relative to root (os.scandir: pathlib's rglob
    took a twentieth of a cached plan)."""
    with os.scandir(os.path.join(root, folder)) as entries:
        for entry in entries:
            rel = f"{folder}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                yield from _sources(root, rel)
            elif entry.name.endswith(".py"):
                yield rel


def key(args: argparse.Namespace, head_rev: str | None) -> str | None:
    """The cache key of this invocation, or None when its result may not be replayed."""
    from desired.reading import gitrepo

    if not args.offline or args.out is not None or head_rev is None or getattr(args, "no_cache", False):
        return None
    try:
        head = gitrepo.resolve(args.path, head_rev)
        base = gitrepo.resolve(args.path, args.base) if args.base else ""
    except gitrepo.RevisionError:
        return None  # the full run reports the unknown revision
    # The folder planned is an input: one repo may hold fleets in `a/` and `b/`, one commit pair for both.
    parts = ("prplan", code_version(), base, head, str(Path(args.path).resolve()), args.policy or "", args.output)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def get(store: DiskStore | None, cache_key: str | None) -> Outcome | None:
    if store is None or cache_key is None:
        return None
    payload = store.get_record("results", cache_key)
    return decode(payload) if payload is not None else None


def put(store: DiskStore | None, cache_key: str | None, outcome: Outcome) -> None:
    if store is not None and cache_key is not None:
        store.put_record("results", cache_key, outcome.encode())
