"""`--no-cache` / `--cache-dir` for commands that read a tree (`plan`, `validate`): the on-disk blob cache.

The cache lives in `<state dir>/cache` (`--state-dir`, $GPUAAS_STATE_DIR),
else in `${XDG_CACHE_HOME:-~/.cache}/gpuaas/cache`; never inside a git
checkout or the tree being read (refused: a pull request could commit a
cache and its key); see `reconciler.caches.blobpacks` for what it holds and why it is
never trusted. One Reader (a BlobCache and a validation memo) serves every tree a
command reads, so a PR plan's base and head parse and check each shared
document once. The heavy modules are imported when a Reader is made.

A git revision's cross-file problems are kept too (a "checked tree"): CI
plans many PRs against one base commit, and validating a large base costs
as much as parsing it from the warm cache. They are a pure function of the
commit, the path in the repo and the code, so they are stored under a hash
of those (namespace `results`, `Store.put_record`) and never trusted: the store checks the
HMAC, the payload is JSON of exactly the expected shape, and anything else
is a miss that validates the tree again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.caches import blobpacks

if TYPE_CHECKING:
    from desired.problems import Problem
    from desired.state import LoadResult
    from policies.validationmemo import Memo
    from reconciler.caches.blobpacks import DiskStore
    from reconciler.caches.blobs import BlobCache

FORMAT = 1
_Owners = dict[str, list[tuple[str, int]]]


def add_arguments(p: Any) -> None:
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="neither read nor write the on-disk cache (parsed blobs; finished offline plans)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="on-disk blob cache, outside every git checkout (default $GPUAAS_STATE_DIR/cache, "
        "else ${XDG_CACHE_HOME:-~/.cache}/gpuaas/cache)",
    )


class Reader:
    """Loads trees for one command, sharing parsed blobs and per-document problems between them."""

    def __init__(self, cache: BlobCache, memo: Memo) -> None:
        self.cache, self.memo = cache, memo
        self.seen: set[str] = set()  # commits an earlier run validated (their checked tree was stored)
        self.problems: tuple[Problem, ...] = ()  # of the last tree loaded

    def load(self, path: Path, rev: str | None) -> LoadResult:
        from desired.reading import gitrepo
        from reconciler import sources

        try:
            disk = self.cache.disk
            commit = commit_of(path, rev) if disk is not None else None
            if disk is not None and commit is not None:
                result = self._load_commit(disk, path, commit)
            else:
                result = sources.load(path, rev, cache=self.cache, memo=self.memo)
            self.problems = tuple(result.problems)
            return result
        finally:
            # A command's reads are few: its git processes end with each read, not when the collector
            # finds the Repo (the next read by delta needs the kept tree, not its Repo).
            gitrepo.release(self.cache)

    def _load_commit(self, disk: DiskStore, path: Path, commit: str) -> LoadResult:
        """`sources.load` of a resolved commit, whose validation an earlier run may have stored."""
        from reconciler import sources

        key = checked_key(path, commit)

        def check(parsed: LoadResult) -> LoadResult:
            stored = disk.get_record("results", key)
            known = decode(stored) if stored is not None else None
            if known is not None:
                self.seen.add(commit)
                return self.memo.adopt(parsed, *known)
            parse_problems, fallbacks = len(parsed.problems), self.memo.fallbacks
            result = self.memo.validate_once(parsed)
            if self.memo.fallbacks == fallbacks:  # after a fall back, the memo's shared MACs are not this tree's
                disk.put_record("results", key, encode(result.problems[parse_problems:], self.memo.owners))
            return result

        # By its id, not its name: the tree read is the one the key names, even if a ref moves.
        return sources.load(path, commit, cache=self.cache, check=check)


def commit_of(path: Path, rev: str | None) -> str | None:
    """The commit id `rev` names, or None: not a revision, or one `sources.load` reports as unreadable."""
    from desired.reading import gitrepo

    if rev is None or not path.exists():
        return None
    try:
        return gitrepo.resolve(path, rev)
    except gitrepo.RevisionError:
        return None


def checked_key(path: Path, commit: str) -> str:
    """Where a commit's checked tree is stored: the path is part of it (a folder of a repo is another tree)."""
    from reconciler.caches import planresults

    parts = ("checked-tree", str(FORMAT), planresults.code_version(), commit, str(path.resolve()))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def encode(found: list[Problem], owners: _Owners) -> bytes:
    return json.dumps(
        {
            "format": FORMAT,
            "found": [[x.code, x.message, x.file, x.line, x.column, x.severity.value] for x in found],
            "owners": {mac: [[node, slot] for node, slot in uses] for mac, uses in owners.items()},
        }
    ).encode()


def decode(payload: bytes) -> tuple[list[Problem], _Owners] | None:
    """The problems and shared MACs a payload holds, or None when it is not exactly what `encode` writes."""
    from desired.problems import Problem, Severity

    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not (
        isinstance(value, dict)
        and set(value) == {"format", "found", "owners"}
        and type(value["format"]) is int
        and value["format"] == FORMAT
        and isinstance(value["found"], list)
        and isinstance(value["owners"], dict)
    ):
        return None
    found = []
    for item in value["found"]:
        if not (
            isinstance(item, list)
            and len(item) == 6
            and all(isinstance(x, str) for x in item[:3])
            and type(item[3]) is int
            and type(item[4]) is int
            and item[5] in (Severity.ERROR.value, Severity.WARNING.value)
        ):
            return None
        found.append(Problem(item[0], item[1], item[2], item[3], item[4], Severity(item[5])))
    owners: _Owners = {}
    for mac, uses in value["owners"].items():
        if not (
            isinstance(uses, list)
            and len(uses) >= 2
            and all(isinstance(u, list) and len(u) == 2 and isinstance(u[0], str) and type(u[1]) is int for u in uses)
        ):
            return None
        owners[mac] = [(node, slot) for node, slot in uses]
    return found, owners


def open_reader(args: argparse.Namespace) -> Reader:
    from policies.validationmemo import Memo
    from reconciler.caches.blobs import BlobCache

    if getattr(args, "no_cache", False):
        return Reader(BlobCache(models_only=True), Memo())  # a command reads models, never plain values
    directory = getattr(args, "cache_dir", None)
    state = getattr(args, "state_dir", None)
    if directory is None and state is not None:
        directory = Path(state) / "cache"
    tree = getattr(args, "path", None)  # what this command reads: a cache inside it is never used
    trees = [Path(tree)] if tree is not None else []
    return Reader(BlobCache(blobpacks.open_store(directory, trees=trees)), Memo())
