"""Read a desired-state tree from a directory or from a git revision.

With a revision the tree is read straight from git objects, without a
checkout, so CI can validate a PR head and the reconciler can apply exactly
the commit it recorded, whatever the working tree holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import git

from desired import loading, yamlio

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


def iter_revision(root: Path, rev: str) -> Iterator[tuple[str, bytes]]:
    """Yield (path, bytes) of every YAML blob in `rev`, sorted by path."""
    try:
        repo = git.Repo(root, search_parent_directories=True)
        commit = repo.commit(rev)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        raise RevisionError(f"{root} is not inside a git repository") from e
    except (git.BadName, ValueError, git.GitCommandError) as e:
        raise RevisionError(f"unknown revision {rev!r}") from e
    top = Path(repo.working_tree_dir or root).resolve()
    prefix = Path(root).resolve().relative_to(top).as_posix()
    try:
        tree = commit.tree if prefix in ("", ".") else commit.tree / prefix
    except KeyError as e:
        raise RevisionError(f"{prefix} does not exist at revision {rev}") from e
    blobs: list[tuple[str, git.Blob]] = []
    for item in tree.traverse():
        if not isinstance(item, git.Blob):
            continue
        path = str(item.path)
        if not path.endswith(loading.YAML_SUFFIXES):
            continue
        rel = path if prefix in ("", ".") else path[len(prefix) + 1 :]
        if any(part in loading.SKIP_DIRS or part.startswith(".") for part in rel.split("/")[:-1]):
            continue
        blobs.append((rel, item))
    for rel, blob in sorted(blobs, key=lambda x: x[0]):
        # Oversized blobs are cut just past the limit: the reader refuses them by size.
        yield rel, bytes(blob.data_stream.read(_MAX_BLOB))


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
