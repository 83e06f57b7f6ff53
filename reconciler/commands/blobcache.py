"""`--no-cache` / `--cache-dir` for commands that read a tree (`plan`, `validate`): the on-disk blob cache.

The cache lives in `<state dir>/cache` (`--state-dir`, $GPUAAS_STATE_DIR or
`.gpuaas`); see `desired.blobstore` for what it holds and why it is never
trusted. One Reader (a BlobCache and a validation memo) serves every tree a
command reads, so a PR plan's base and head parse and check each shared
document once. The heavy modules are imported when a Reader is made.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from desired.loading import BlobCache, LoadResult
    from policies.validating import Memo


def add_arguments(p: Any) -> None:
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the on-disk cache (parsed blobs; finished offline plans)")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="on-disk blob cache (default <state dir>/cache: $GPUAAS_STATE_DIR or .gpuaas)")


class Reader:
    """Loads trees for one command, sharing parsed blobs and per-document problems between them."""

    def __init__(self, cache: BlobCache, memo: Memo) -> None:
        self.cache, self.memo = cache, memo

    def load(self, path: Path, rev: str | None) -> LoadResult:
        from desired import gitrepo
        from reconciler import sources

        try:
            return sources.load(path, rev, cache=self.cache, memo=self.memo)
        finally:
            # A command's reads are few: its git processes end with each read, not when the collector
            # finds the Repo (the next read by delta needs the kept tree, not its Repo).
            gitrepo.release(self.cache)


def open_reader(args: argparse.Namespace) -> Reader:
    from desired import blobstore
    from desired.loading import BlobCache
    from policies.validating import Memo

    if getattr(args, "no_cache", False):
        return Reader(BlobCache(), Memo())
    directory = getattr(args, "cache_dir", None)
    state = getattr(args, "state_dir", None)
    if directory is None and state is not None:
        directory = Path(state) / "cache"
    return Reader(BlobCache(blobstore.open_store(directory)), Memo())
