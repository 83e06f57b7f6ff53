"""Read a desired-state tree from a directory or from a git revision.

With a revision the tree is read straight from git objects, without a
checkout, so CI can validate a PR head and the reconciler can apply exactly
the commit it recorded, whatever the working tree holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import git

from desired import loading, yamlio
from desired import problems as p

_MAX_BLOB = yamlio.MAX_FILE_BYTES + 1


class RevisionError(Exception):
    code = "desired.git.revision"


class RefNameError(ValueError):
    code = "gitops.ref_name"


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


def revision_refs(root: Path, rev: str) -> list[loading.FileRef]:
    """Every YAML file of `rev` under root as a FileRef (blob id as key, bytes read on demand), by path.

    One `git ls-tree` lists the tree with modes and blob ids, so a caller with
    a cache reads only blobs it has not parsed yet. A symlink in the tree
    (mode 120000) is never resolved: it is refused with `desired.file.symlink`.
    """
    try:
        repo = git.Repo(root, search_parent_directories=True)
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
    # The commit id is 40 hex characters and the path comes after '--': nothing here reads as an option.
    listing = repo.git.ls_tree("-r", "-z", "--full-tree", commit.hexsha, "--", *([prefix] if prefix else []))
    refs: list[loading.FileRef] = []
    for entry in listing.split("\0"):
        if not entry:
            continue
        meta, path = entry.split("\t", 1)
        mode, kind, sha = meta.split(" ")
        if kind != "blob" or mode == _GITLINK_MODE or not path.endswith(loading.YAML_SUFFIXES):
            continue
        rel = path[len(prefix) + 1:] if prefix else path
        if any(part in loading.SKIP_DIRS or part.startswith(".") for part in rel.split("/")[:-1]):
            continue
        if mode == _SYMLINK_MODE:
            refused = loading.Refused(p.FILE_SYMLINK, "is a symbolic link; only regular files inside the repo are read")
            refs.append(loading.FileRef(rel, None, _constant(refused)))
        else:
            refs.append(loading.FileRef(rel, sha, _blob_reader(repo, sha)))
    refs.sort(key=lambda r: r.name)
    return refs


def _constant(data: loading.FileData) -> Callable[[], loading.FileData]:
    return lambda: data


def _blob_reader(repo: git.Repo, sha: str) -> Callable[[], loading.FileData]:
    def read() -> loading.FileData:
        # Oversized blobs are cut just past the limit: the reader refuses them by size.
        return bytes(repo.odb.stream(bytes.fromhex(sha)).read(_MAX_BLOB))

    return read


def iter_revision(root: Path, rev: str) -> Iterator[tuple[str, loading.FileData]]:
    """Yield (path, bytes or Refused) of every YAML file in `rev`, sorted by path."""
    for ref in revision_refs(root, rev):
        yield ref.name, ref.read()


def resolve(root: Path, rev: str) -> str:
    try:
        return str(git.Repo(root, search_parent_directories=True).commit(rev).hexsha)
    except Exception as e:  # gitpython raises many unrelated types for a bad name
        raise RevisionError(f"unknown revision {rev!r}") from e


def head(root: Path) -> str | None:
    try:
        return str(git.Repo(root, search_parent_directories=True).head.commit.hexsha)
    except Exception:  # not a repo, or no commits yet: a plain directory is fine
        return None
