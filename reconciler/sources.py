"""Load and validate a desired-state repo from a directory or a git revision."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from desired.reading import gitrepo, loading, safefiles
from desired.state import LoadResult
from policies import validation, validationmemo
from reconciler import codes as reconciler_codes
from schemas import progress
from schemas.errors import PermanentError

Check = Callable[[LoadResult], LoadResult]


def load(
    path: Path,
    rev: str | None = None,
    *,
    cancel: loading.Cancel | None = None,
    cache: loading.BlobMemory | None = None,
    memo: validationmemo.Memo | None = None,
    check: Check | None = None,
) -> LoadResult:
    """Read, parse and cross-check every file; problems are collected, not raised.

    With `cache`, files whose content was parsed before (same git blob id) are
    taken from it instead of being read and parsed again (the watch loop keeps
    one across revisions). With `memo`, cross-file rules run again only for
    documents whose inputs changed (`policies.validationmemo`). `check`, if
    given, adds the cross-file problems instead (a CLI reader that may have
    them stored, `reconciler.caches.checkedtrees`). Raises
    PermanentError only when the source itself cannot be read (no such
    directory, unknown revision); loading.Cancelled when `cancel` says stop.
    """
    if not path.exists():
        raise PermanentError(f"{path}: no such directory", code=reconciler_codes.DESIRED_PATH_MISSING)
    with loading.collector_paused():
        return _load(path, rev, cancel=cancel, cache=cache, check=check or (memo.validate if memo else None))


def _load(
    path: Path, rev: str | None, *, cancel: loading.Cancel | None, cache: loading.BlobMemory | None, check: Check | None
) -> LoadResult:
    return checked(_parse(path, rev, cancel=cancel, cache=cache), check)


def parse(
    path: Path, rev: str, *, cancel: loading.Cancel | None = None, cache: loading.BlobMemory | None = None
) -> LoadResult:
    """`load` without the cross-file rules: every file parsed and typed, with its own problems.

    For a caller that runs the rules (`checked`) beside other work and acts on
    the state only once they pass (the watch loop's first revision: the rules
    run while the inventory sync's transaction, still open, waits on the
    server).
    """
    if not path.exists():
        raise PermanentError(f"{path}: no such directory", code=reconciler_codes.DESIRED_PATH_MISSING)
    with loading.collector_paused():
        return _parse(path, rev, cancel=cancel, cache=cache)


def _parse(
    path: Path, rev: str | None, *, cancel: loading.Cancel | None, cache: loading.BlobMemory | None
) -> LoadResult:
    try:
        if rev is not None:
            parsed = gitrepo.read_revision(path, rev, cancel=cancel, cache=cache)
            revision: str | None = gitrepo.resolve(path, rev)
        else:
            files = _read_directory(path)
            revision = gitrepo.head(path)
            parsed = loading.parse_files(files, cancel=cancel, cache=cache)
    except gitrepo.RevisionError as e:
        raise PermanentError(str(e), code=gitrepo.RevisionError.code) from e
    parsed.state.revision = revision
    return parsed


def checked(parsed: LoadResult, check: Check | None = None) -> LoadResult:
    """The cross-file rules' problems added to a parse result (`parse`): `check`, else `validation.validate`."""
    state = parsed.state
    documents = len(state.nodes) + len(state.slot_maps) + len(state.skus) + len(state.images) + len(state.allocations)
    with progress.active().phase("validate documents", documents, unit="documents") as counted:
        result = check(parsed) if check is not None else validation.validate(parsed)
        counted.done = documents  # the rules run per kind, not per document: counted once, at the end
    return result


def _read_directory(path: Path) -> list[tuple[str, safefiles.FileData]]:
    """Every file under `path` with its bytes, counted on the command's progress display in batches."""
    files: list[tuple[str, safefiles.FileData]] = []
    with progress.active().phase("read files", unit="files") as counted:
        for item in safefiles.iter_directory(path):
            files.append(item)
            if len(files) % 256 == 0:
                counted.done = len(files)
        counted.done = len(files)
    return files


def release(cache: loading.BlobMemory) -> None:
    """End the git processes kept for the cache's last tree (a loop that stops, a command that is done)."""
    gitrepo.release(cache)
