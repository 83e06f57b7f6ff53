"""Read a desired-state tree from a directory or from a git revision.

With a revision the tree is read straight from git objects, without a
checkout, so CI can validate a PR head and the reconciler can apply exactly
the commit it recorded, whatever the working tree holds.

Revisions are resolved, and a revision read by delta from a kept tree, from
the repository's own files where that is exactly what git reads
(`gitobjects`: no GitPython import, no git process); everything else, and
any doubt, goes through GitPython as before.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desired import codes as desired_codes
from desired import problems as p
from desired.reading import deltas, gitobjects, loading, safefiles, yamlio
from desired.state import LoadResult

if TYPE_CHECKING:
    import git

_MAX_BLOB = yamlio.MAX_FILE_BYTES + 1
# Fewer blobs than this are read one by one: the Repo's running cat-file answers them sooner than
# two new git processes start.
BATCH_MIN = 64
# Most bytes one `cat-file --batch` call returns: bounds the extra copy the batch output holds, and
# `cancel` is looked at between calls.
BATCH_BYTES = 16 * 1024 * 1024
_BATCH_TIMEOUT_S = 600.0

log = logging.getLogger("gpuaas.loading")


class RevisionError(Exception):
    code = desired_codes.GIT_REVISION


class RefNameError(ValueError):
    code = desired_codes.GITOPS_REF_NAME


# git check-ref-format's rules, plus no leading '-' (a name must never read as an option).
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def check_ref_name(name: str, what: str = "name") -> str:
    """`name` if git would accept it as a branch or remote name; RefNameError (saying why) otherwise."""
    why = None
    if not name:
        why = "is empty"
    elif name.startswith("-"):
        why = "starts with '-'"
    elif _REF_FORBIDDEN.search(name):
        why = "holds a space, a control character or one of ~ ^ : ? * [ \\"
    elif ".." in name or "@{" in name or "//" in name or name == "@":
        why = "holds '..', '@{' or '//', or is '@'"
    elif name.startswith("/") or name.endswith(("/", ".", ".lock")):
        why = "starts with '/' or ends with '/', '.' or '.lock'"
    elif any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        why = "has a component starting with '.' or ending with '.lock'"
    elif len(name) > 255:
        why = "is longer than 255 characters"
    if why is not None:
        raise RefNameError(f"{what} {name!r} {why}; git refuses it as a ref name")
    return name


_SYMLINK_MODE = "120000"
_GITLINK_MODE = "160000"
_TREE_MODE = "040000"
_ABSENT_MODE = gitobjects.ABSENT  # diff-tree's mode of the side where a path does not exist
_REPO = "gitrepo.repo"  # Tree.extra: (root, the git.Repo it was read with)


def revision_refs(root: Path, rev: str) -> list[loading.FileRef]:
    """Every YAML file of `rev` under root as a FileRef (blob id as key, bytes read on demand), by path.

    One `git ls-tree` lists the tree with modes and blob ids, so a caller with
    a cache reads only blobs it has not parsed yet. A symlink in the tree
    (mode 120000) is never resolved: it is refused with `desired.file.symlink`.
    """
    repo, commit, prefix = _open(root, rev)
    return _refs(repo, commit, prefix)


def revision_blob_ids(root: Path, rev: str, names: Collection[str] | None = None) -> dict[str, str | None]:
    """Path -> git blob id of every YAML file of `rev` under root (None: a symlink, never read).

    With `names` (paths relative to root): only those files are looked up.
    """
    if names is not None and not names:
        return {}  # no pathspec would list the whole tree
    repo, commit, prefix = _open(root, rev)
    with repo:
        found = {ref.name: ref.key for ref in _refs(repo, commit, prefix, names)}
    # A name that is a directory at `rev` lists the files below it: they were not asked for.
    return found if names is None else {name: found[name] for name in names if name in found}


def _open(root: Path, rev: str, repo: git.Repo | None = None) -> tuple[git.Repo, Any, str]:
    import git  # only where a revision is read whole or in an unusual repository (see `gitobjects`)

    try:
        repo = repo or git.Repo(root, search_parent_directories=True)
        commit = repo.commit(rev)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        raise RevisionError(f"{root} is not inside a git repository") from e
    except (git.BadName, ValueError, git.GitCommandError) as e:
        raise RevisionError(f"unknown revision {rev!r}") from e
    top = Path(repo.working_tree_dir or root).resolve()
    prefix = Path(root).resolve().relative_to(top).as_posix()
    prefix = "" if prefix in ("", ".") else prefix
    if prefix:
        try:
            commit.tree / prefix
        except KeyError as e:
            raise RevisionError(f"{prefix} does not exist at revision {rev}") from e
    return repo, commit, prefix


def _refs(repo: git.Repo, commit: Any, prefix: str, names: Collection[str] | None = None) -> list[loading.FileRef]:
    # The commit id is 40 hex characters and the path comes after '--': nothing here reads as an option.
    listing = repo.git.ls_tree("-r", "-z", "--full-tree", commit.hexsha, "--", *_pathspecs(prefix, names))
    refs: list[loading.FileRef] = []
    read_many = _batch_reader(repo)
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, _, sha = meta.split(" ")
        ref = _ref(repo, prefix, mode, sha, path, read_many=read_many)
        if ref is not None:
            refs.append(ref)
    refs.sort(key=lambda r: r.name)
    return refs


def _pathspecs(prefix: str, names: Collection[str] | None) -> list[str]:
    if names is None:
        return [prefix] if prefix else []
    # Literal: a file named ':x.yaml' or 'a*.yaml' is that file, not a pattern or magic.
    return [":(literal)" + (f"{prefix}/{name}" if prefix else name) for name in names]


def _ref(
    repo: git.Repo | gitobjects.Repo,
    prefix: str,
    mode: str,
    sha: str,
    path: str,
    *,
    read_many: loading.ReadMany | None = None,
) -> loading.FileRef | None:
    """The FileRef of one tree entry, None when it is not read (not YAML, a submodule, a skipped directory)."""
    if mode in (_GITLINK_MODE, _TREE_MODE) or not path.endswith(safefiles.YAML_SUFFIXES):
        return None
    rel = path[len(prefix) + 1 :] if prefix else path
    if any(part in safefiles.SKIP_DIRS or part.startswith(".") for part in rel.split("/")[:-1]):
        return None
    if mode == _SYMLINK_MODE:
        refused = safefiles.UnreadFile(
            p.FILE_SYMLINK, "is a symbolic link; only regular files inside the repo are read"
        )
        return loading.FileRef(rel, None, _constant(refused))
    return loading.FileRef(rel, sha, _blob_reader(repo, sha), read_many)


def read_revision(
    root: Path, rev: str, *, cache: loading.BlobMemory | None = None, cancel: loading.Cancel | None = None
) -> LoadResult:
    """Parse and type the tree of `rev`, as `parse_refs(revision_refs(root, rev))` gives it.

    With a cache that kept the tree of an ancestor of `rev` (the watch loop),
    only the paths `git diff-tree` names as changed are read and the kept
    tree is updated (`desired.reading.deltas`). On any doubt the whole tree is read,
    and the reason is logged and kept in `cache.last_full`.
    """
    if cache is not None and cache.tree is not None:
        fast = _fast_delta(root, rev, cache, cancel=cancel)
        if fast is not None:
            return fast
    # The kept tree's Repo is reused: its object reader (a `git cat-file` process) stays up between revisions.
    kept = cache.tree.extra.get(_REPO) if cache is not None and cache.tree is not None else None
    repo, commit, prefix = _open(root, rev, kept[1] if kept is not None and kept[0] == root else None)
    if _COMMIT_ID.fullmatch(rev):  # `resolve` after a read opens no Repo of its own (a git process per commit)
        _remember(root, rev, str(commit.hexsha))
    if kept is not None and kept[1] is not repo:
        kept[1].close()  # replaced below: its git processes end now, not whenever the collector finds them
    try:
        return _read(root, repo, commit, prefix, cache=cache, cancel=cancel)
    finally:
        if cache is None:
            repo.close()


def _fast_delta(root: Path, rev: str, cache: loading.BlobMemory, *, cancel: loading.Cancel | None) -> LoadResult | None:
    """`rev` read by delta from the kept tree through `gitobjects`; None: read it the usual way.

    Taken only where every step is read as git reads it: the repository,
    `rev`, the kept revision being `rev` or an ancestor of it, both trees.
    """
    fast = gitobjects.open_repo(root)
    if fast is None:
        return None
    try:
        found = _fast_changes(fast, root, rev, cache)
        got = deltas.apply(cache, found[0], found[1], cancel=cancel) if found is not None else None
    except loading.Cancelled:
        raise
    except Exception as e:  # any doubt: the usual way gives the right answer
        log.info("reading %s from git's files failed (%s: %s); asking git", rev, type(e).__name__, e)
        return None
    finally:
        gitobjects.release()
    if not isinstance(got, LoadResult):
        return None  # the usual way reads it, whole if it must, and says why
    cache.last_full = ""
    return got


def _fast_changes(
    fast: gitobjects.Repo, root: Path, rev: str, cache: loading.BlobMemory
) -> tuple[str, list[tuple[str, loading.FileRef | None]]] | None:
    """The commit `rev` names and the files it changes from the kept tree's; None: not settled here."""
    kept = cache.tree
    top = fast.top.resolve()
    prefix = Path(root).resolve().relative_to(top).as_posix()
    prefix = "" if prefix in ("", ".") else prefix
    commit = fast.commit(rev)
    if kept is None or commit is None or kept.origin != f"{top}\0{prefix}":
        return None
    if kept.revision != commit:
        parents = fast.parents(commit)
        if parents is None or (kept.revision not in parents and not fast.is_ancestor(kept.revision, commit)):
            return None  # not settled here, or not a descendant: the usual way says which
    old, new = fast.tree_of(kept.revision), fast.tree_of(commit)
    if old is None or new is None or (prefix and not fast.holds(new, prefix)):
        return None
    rows = fast.diff(old, new, prefix)
    return (commit, _changes(fast, prefix, rows)) if rows is not None else None


def _changes(
    repo: git.Repo | gitobjects.Repo,
    prefix: str,
    rows: Iterable[tuple[str, str, str, str, str]],
    read_many: loading.ReadMany | None = None,
) -> list[tuple[str, loading.FileRef | None]]:
    """The YAML files `diff-tree` rows (old mode, new mode, old id, new id, path) change: path -> new file or None."""
    changes: list[tuple[str, loading.FileRef | None]] = []
    for old_mode, new_mode, _, new_sha, path in rows:
        if new_mode == _ABSENT_MODE:
            if _ref(repo, prefix, old_mode, new_sha, path) is not None:
                changes.append((path[len(prefix) + 1 :] if prefix else path, None))
            continue
        ref = _ref(repo, prefix, new_mode, new_sha, path, read_many=read_many)
        if ref is not None:
            changes.append((ref.name, ref))
        elif _ref(repo, prefix, old_mode, new_sha, path) is not None:  # a YAML file became a submodule
            changes.append((path[len(prefix) + 1 :] if prefix else path, None))
    return changes


def release(cache: loading.BlobMemory) -> None:
    """End the git processes of the Repo a cache's kept tree was read with (the cache stays usable)."""
    kept = cache.tree.extra.pop(_REPO, None) if cache.tree is not None else None
    if kept is not None:
        kept[1].close()


def _read(
    root: Path,
    repo: git.Repo,
    commit: Any,
    prefix: str,
    *,
    cache: loading.BlobMemory | None,
    cancel: loading.Cancel | None,
) -> LoadResult:
    origin = f"{Path(repo.working_tree_dir or root).resolve()}\0{prefix}"
    if cache is not None and cache.tree is not None and cache.tree.origin == origin:
        try:
            got = _by_delta(repo, commit, prefix, cache, cancel=cancel)
        except loading.Cancelled:
            raise
        except Exception as e:  # any doubt: the whole tree gives the right answer
            got = f"the delta read failed ({type(e).__name__}: {e})"
        if isinstance(got, LoadResult):
            cache.last_full = ""
            return got
        cache.last_full = got
        log.info("reading the whole tree of %s: %s", commit.hexsha[:12], got)
    refs = _refs(repo, commit, prefix)
    blobs = loading.blobs_for(refs, cancel=cancel, cache=cache)
    result = loading.assemble(blobs)
    if cache is not None:
        tree = deltas.tree_of(origin, str(commit.hexsha), refs, blobs, result)
        tree.extra[_REPO] = (root, repo)
        deltas.remember(cache, tree)
    return result


def _by_delta(
    repo: git.Repo, commit: Any, prefix: str, cache: loading.BlobMemory, *, cancel: loading.Cancel | None
) -> LoadResult | str:
    kept = cache.tree
    assert kept is not None  # noqa: S101 - checked by the caller
    if kept.revision != commit.hexsha:
        base = repo.commit(kept.revision)
        if base not in commit.parents and not repo.is_ancestor(base, commit):
            return f"{commit.hexsha[:12]} does not descend from the kept {kept.revision[:12]}"
    # What `git diff-tree -r --no-renames` names, without a git process per commit (`treediffs`, which
    # imports GitPython: only here, off a kept base's path).
    from desired.reading import treediffs

    rows = (
        (c.old_mode, c.new_mode, "", c.new_id, c.path)
        for c in treediffs.diff(repo, kept.revision, commit.hexsha, prefix)
    )
    changes = _changes(repo, prefix, rows, _batch_reader(repo))
    return deltas.apply(cache, str(commit.hexsha), changes, cancel=cancel)


def _constant(data: safefiles.FileData) -> Callable[[], safefiles.FileData]:
    return lambda: data


def _blob_reader(repo: git.Repo | gitobjects.Repo, sha: str) -> Callable[[], safefiles.FileData]:
    if isinstance(repo, gitobjects.Repo):
        return _fast_blob_reader(repo, sha)

    def read() -> safefiles.FileData:
        # Oversized blobs are cut just past the limit: the reader refuses them by size.
        return bytes(repo.odb.stream(bytes.fromhex(sha)).read(_MAX_BLOB))

    return read


def _fast_blob_reader(repo: gitobjects.Repo, sha: str) -> Callable[[], safefiles.FileData]:
    def read() -> safefiles.FileData:
        got = repo.read(sha, _MAX_BLOB)  # oversized blobs are cut just past the limit, as below
        if got is None or got[0] != "blob":
            raise RevisionError(f"blob {sha} cannot be read from the repository's files")
        return got[1]

    return read


def _batch_reader(repo: git.Repo) -> loading.ReadMany:
    """Reads many blobs of `repo` with two git processes, not a cat-file round trip per blob.

    `cat-file --batch-check` gives every size first, so only blobs within the
    limit are fetched whole (with `--batch`); an oversized one is left to its
    ref's cut-off `read`, and so is any blob the output leaves in doubt.
    """

    def read_many(keys: Sequence[str]) -> Iterator[dict[str, bytes]]:
        if len(keys) < BATCH_MIN:
            return
        sizes = _blob_sizes(repo, keys)
        small = [key for key in keys if sizes.get(key, _MAX_BLOB) < _MAX_BLOB]
        for part in _parts(small, sizes):
            yield _cat_blobs(repo, part, sizes)

    return read_many


def _blob_sizes(repo: git.Repo, keys: Sequence[str]) -> dict[str, int]:
    """Size by key of every key git holds as a blob; empty when the output is not one line per key as asked."""
    out = _cat_file(repo, "--batch-check", keys)
    lines = out.split(b"\n") if out is not None else []
    if len(lines) != len(keys) + 1 or lines[-1] != b"":
        return {}
    sizes: dict[str, int] = {}
    for key, line in zip(keys, lines, strict=False):
        fields = line.decode("ascii", "replace").split(" ")
        if fields == [key, "missing"]:
            continue  # its own read says what is wrong, as before
        if len(fields) != 3 or fields[0] != key or fields[1] != "blob" or not fields[2].isdigit():
            return {}
        sizes[key] = int(fields[2])
    return sizes


def _parts(keys: list[str], sizes: dict[str, int]) -> Iterator[list[str]]:
    """`keys` in order, cut into runs of at most BATCH_BYTES of content (a larger blob goes alone)."""
    part: list[str] = []
    total = 0
    for key in keys:
        if part and total + sizes[key] > BATCH_BYTES:
            yield part
            part, total = [], 0
        part.append(key)
        total += sizes[key]
    if part:
        yield part


def _cat_blobs(repo: git.Repo, keys: list[str], sizes: dict[str, int]) -> dict[str, bytes]:
    """The bytes of `keys` by one `cat-file --batch`; empty (each read on its own) unless the output is exactly
    `<key> blob <size>\n`, size bytes and `\n` for every key, in order, and nothing more."""
    out = _cat_file(repo, "--batch", keys)
    if out is None:
        return {}
    got: dict[str, bytes] = {}
    pos = 0
    for key in keys:
        header = f"{key} blob {sizes[key]}\n".encode("ascii")
        start = pos + len(header)
        end = start + sizes[key]
        if out[pos:start] != header or out[end : end + 1] != b"\n":
            log.info("git cat-file --batch gave unexpected output at %s; reading blobs one by one", key)
            return {}
        got[key] = out[start:end]
        pos = end + 1
    if pos != len(out):
        log.info("git cat-file --batch gave %d bytes more than asked; reading blobs one by one", len(out) - pos)
        return {}
    return got


_CAT_FILE_MODES = frozenset({"--batch", "--batch-check"})


def _cat_file(repo: git.Repo, mode: str, keys: Sequence[str]) -> bytes | None:
    """stdout of `git cat-file <mode> --buffer` fed `keys`, run by GitPython for `repo`; None if it failed.

    GitPython starts git (this layer never spawns processes itself): its
    environment, its executable, an argument list, no shell.
    """
    # Fixed arguments only: the object ids go to stdin, never onto the command line.
    if mode not in _CAT_FILE_MODES:
        raise ValueError(f"not a cat-file batch mode: {mode!r}")
    command = [str(repo.git.GIT_PYTHON_GIT_EXECUTABLE or "git"), "cat-file", mode, "--buffer"]
    try:
        with tempfile.TemporaryFile() as ids:
            ids.write("".join(f"{key}\n" for key in keys).encode("ascii"))
            ids.seek(0)
            out = repo.git.execute(
                command,
                istream=ids,
                stdout_as_string=False,
                strip_newline_in_stdout=False,
                kill_after_timeout=_BATCH_TIMEOUT_S,
            )
    except (OSError, _git_error()) as e:
        log.info("git cat-file %s failed (%s); reading blobs one by one", mode, e)
        return None
    return out if isinstance(out, bytes) else None


_COMMIT_ID = re.compile(r"[0-9a-f]{40}")
# (repo folder, full object id) -> the commit git said it names. An object id names the same commit
# forever, so a command that resolves it several times (a PR plan: its cache keys, then the read)
# asks git once; a ref or a short id ("HEAD", "main", "abc123") can move and is asked every time.
_RESOLVED: dict[tuple[str, str], str] = {}
_RESOLVED_MAX = 1024


def _git_error() -> type[Exception]:
    import git

    return git.GitCommandError


def _fast_commit(root: Path, rev: str) -> str | None:
    """The commit `rev` names read from the repository's files (`gitobjects`); None: ask git."""
    fast = gitobjects.open_repo(root)
    try:
        return fast.commit(rev) if fast is not None else None
    finally:
        gitobjects.release()


def resolve(root: Path, rev: str) -> str:
    known = (os.path.abspath(root), rev) if _COMMIT_ID.fullmatch(rev) else None
    if known is not None and known in _RESOLVED:
        return _RESOLVED[known]
    commit = _fast_commit(root, rev)
    if commit is None:
        import git

        try:
            with git.Repo(root, search_parent_directories=True) as repo:
                commit = str(repo.commit(rev).hexsha)
        except Exception as e:  # gitpython raises many unrelated types for a bad name
            raise RevisionError(f"unknown revision {rev!r}") from e
    if known is not None:
        _remember(root, rev, commit)
    return commit


def _remember(root: Path, rev: str, commit: str) -> None:
    if len(_RESOLVED) >= _RESOLVED_MAX:  # a watch loop's lifetime of commits: bounded
        _RESOLVED.clear()
    _RESOLVED[(os.path.abspath(root), rev)] = commit


def head(root: Path) -> str | None:
    fast = _fast_commit(root, "HEAD")
    if fast is not None:
        return fast
    import git

    try:
        with git.Repo(root, search_parent_directories=True) as repo:
            return str(repo.head.commit.hexsha)
    except Exception:  # not a repo, or no commits yet: a plain directory is fine
        return None
