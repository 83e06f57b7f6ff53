"""A repository's refs and objects read from its own files, where that is exactly what git reads.

A PR plan from a kept base (`reconciler.caches.keptworlds`) needs two
commits, the trees along the paths the PR changes and the blobs of those
files: importing GitPython and starting its `git cat-file` processes was a
tenth of that plan. Here refs are read from the repository's files (loose
refs, `packed-refs`, symbolic refs, a linked worktree's own HEAD) and
objects through gitdb (loose objects and packs, alternates), and trees are
compared as `git diff-tree -r --no-renames` compares them.

Only the plain cases are read here; for anything else `open_repo` or the
method gives None and the caller asks git itself (`gitrepo`, GitPython): an
environment that names git directories or turns replace refs off, replace
refs, grafts or a shallow history, another object format or ref storage,
`core.worktree` or a bare repository, a short object id or an expression
(`HEAD~1`, `main@{1}`, `v1^{tree}`), a ref file of another shape, an object
gitdb cannot find.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TREE = "040000"
ABSENT = "000000"
_ZERO = "0" * 40
_FULL_ID = re.compile(r"[0-9a-f]{40}")
_HEXISH = re.compile(r"[0-9a-fA-F]{4,40}")  # GitPython reads such a name as an object id first
# A ref name read here: plain characters, no component starting with '.', nothing git would expand.
_PLAIN_REF = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._/-]*")
_PER_WORKTREE = ("refs/bisect/", "refs/worktree/", "refs/rewritten/")
# Environment that changes where git looks or what it reads: git itself is asked.
_GIT_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_REPLACE_REF_BASE",
    "GIT_NO_REPLACE_OBJECTS",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_GRAFT_FILE",
    "GIT_SHALLOW_FILE",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
)
_DWIM = ("{}", "refs/{}", "refs/tags/{}", "refs/heads/{}", "refs/remotes/{}", "refs/remotes/{}/HEAD")
_ANCESTRY_LIMIT = 2000  # commits walked looking for an ancestor before git is asked


class _Unsure(Exception):
    """Something this module does not read exactly as git does: the caller asks git."""


@dataclass
class Repo:
    """A repository found from a folder: its git dir, common dir, working tree and object database."""

    gitdir: Path
    common: Path
    top: Path  # the working tree: what paths in a commit are relative to
    db: Any  # gitdb.GitDB
    _packed: dict[str, str] | None = field(default=None, repr=False)

    # ------------------------------------------------------------ revisions

    def commit(self, rev: str) -> str | None:
        """The full id of the commit `rev` names, or None: not read here (git is asked)."""
        try:
            if _FULL_ID.fullmatch(rev):
                sha: str | None = rev
            elif _HEXISH.fullmatch(rev) or not _plain_ref(rev):
                return None  # a short id or an expression: git's rules, not repeated here
            else:
                sha = self._dwim(rev)
            return self._peel(sha) if sha is not None else None
        except _Unsure:
            return None

    def _peel(self, sha: str) -> str | None:
        for _ in range(8):
            got = self.read(sha)
            if got is None:
                return None
            kind, data = got
            if kind == "commit":
                return sha
            if kind != "tag" or not data.startswith(b"object "):
                return None  # a tree or a blob names no commit: git says why
            sha = data[7:47].decode("ascii")
        return None

    def _dwim(self, name: str) -> str | None:
        """`name` as git reads a ref name: $GIT_DIR/name, refs/name, refs/tags/name, ... in that order."""
        for pattern in _DWIM:
            sha = self._ref(pattern.format(name), depth=0)
            if sha is not None:
                return sha
        return None

    def _ref(self, name: str, *, depth: int) -> str | None:
        """The object id ref `name` (a full ref name) holds; None when there is no such ref."""
        if depth > 5 or not _plain_ref(name):
            raise _Unsure(f"ref {name!r}")
        per_worktree = "/" not in name or name.startswith(_PER_WORKTREE)  # HEAD and the other pseudorefs
        folder = self.gitdir if per_worktree else self.common
        try:
            text = (folder / name).read_bytes().decode("utf-8").strip()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            if per_worktree:
                return None
            return self._packed_refs().get(name)
        except (OSError, UnicodeDecodeError) as e:
            raise _Unsure(f"ref {name!r}: {e}") from e
        if _FULL_ID.fullmatch(text):
            return text
        if text.startswith("ref: "):
            target = text[5:].strip()
            if not (target == "HEAD" or target.startswith("refs/")):
                raise _Unsure(f"symbolic ref {name!r} -> {target!r}")
            return self._ref(target, depth=depth + 1)
        raise _Unsure(f"ref {name!r} is not an object id or a symbolic ref")  # FETCH_HEAD and the like

    def _packed_refs(self) -> dict[str, str]:
        if self._packed is None:
            packed: dict[str, str] = {}
            try:
                lines = (self.common / "packed-refs").read_text("utf-8").splitlines()
            except FileNotFoundError:
                lines = []
            except (OSError, UnicodeDecodeError) as e:
                raise _Unsure(f"packed-refs: {e}") from e
            for line in lines:
                if not line or line.startswith(("#", "^")):
                    continue  # the header, and the peeled value of the tag above
                sha, _, name = line.partition(" ")
                if not _FULL_ID.fullmatch(sha) or not name:
                    raise _Unsure("packed-refs holds a line of another shape")
                packed[name] = sha
            self._packed = packed
        return self._packed

    def is_ancestor(self, ancestor: str, commit: str) -> bool | None:
        """Whether `ancestor` is `commit` or one of its ancestors; None: not settled here (git is asked)."""
        seen = {commit}
        todo = [commit]
        while todo:
            sha = todo.pop()
            if sha == ancestor:
                return True
            if len(seen) > _ANCESTRY_LIMIT:
                return None
            parents = self.parents(sha)
            if parents is None:
                return None
            for parent in parents:
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return False

    def parents(self, commit: str) -> list[str] | None:
        headers = self._commit_headers(commit)
        return None if headers is None else [v for k, v in headers if k == "parent"]

    def tree_of(self, commit: str) -> str | None:
        headers = self._commit_headers(commit)
        trees = [] if headers is None else [v for k, v in headers if k == "tree"]
        return trees[0] if len(trees) == 1 else None

    def _commit_headers(self, commit: str) -> list[tuple[str, str]] | None:
        got = self.read(commit)
        if got is None or got[0] != "commit":
            return None
        head = got[1].split(b"\n\n", 1)[0].decode("utf-8", "replace")
        out = []
        for line in head.split("\n"):
            key, _, value = line.partition(" ")
            if key in ("tree", "parent"):
                if not _FULL_ID.fullmatch(value):
                    return None
                out.append((key, value))
        return out

    # ------------------------------------------------------------ objects

    def read(self, sha: str, limit: int = -1) -> tuple[str, bytes] | None:
        """(type, content) of object `sha` (content cut at `limit` bytes), or None when gitdb cannot give it."""
        try:
            stream = self.db.stream(bytes.fromhex(sha))
            return stream.type.decode("ascii"), stream.read(limit) if limit >= 0 else stream.read()
        except Exception:  # gitdb raises its own and the OS's errors alike: git is asked
            return None

    def entries(self, tree: str) -> list[tuple[str, str, str]] | None:
        """(mode as diff-tree prints it, name, id) of each entry of tree `tree`, in the tree's order."""
        got = self.read(tree)
        if got is None or got[0] != "tree":
            return None
        data, out, at = got[1], [], 0
        while at < len(data):
            space = data.index(b" ", at)
            nul = data.index(b"\0", space)
            if nul + 21 > len(data):
                return None
            mode = data[at:space].decode("ascii").rjust(6, "0")
            out.append((mode, data[space + 1 : nul].decode("utf-8", "surrogateescape"), data[nul + 1 : nul + 21].hex()))
            at = nul + 21
        return out

    def holds(self, tree: str, folder: str) -> bool:
        """Whether `folder` (a/b) is a folder of `tree`."""
        for part in folder.split("/"):
            entries = self.entries(tree) or ()
            found = [sha for mode, name, sha in entries if name == part and mode == TREE]
            if not found:
                return False
            tree = found[0]
        return True

    def diff(self, old_tree: str, new_tree: str, prefix: str = "") -> list[tuple[str, str, str, str, str]] | None:
        """`git diff-tree -r --no-renames OLD NEW -- PREFIX` as (old mode, new mode, old id, new id, path) rows.

        Subtrees with the same id are not opened; rows come in git's order.
        None when a tree cannot be read.
        """
        try:
            return list(self._diff(old_tree, new_tree, "", prefix.strip("/")))
        except _Unsure:
            return None

    def _diff(
        self, old: str | None, new: str | None, base: str, prefix: str
    ) -> Iterator[tuple[str, str, str, str, str]]:
        before = self._listed(old)
        after = self._listed(new)
        for key in sorted(before.keys() | after.keys()):
            a, b = before.get(key), after.get(key)
            path = base + (a or b)[1]  # type: ignore[index]  # one of them is there
            if prefix and not (path == prefix or path.startswith(prefix + "/") or prefix.startswith(path + "/")):
                continue
            if a is not None and b is not None and a[0] == b[0] and a[2] == b[2]:
                continue
            if (a or b)[0] == TREE:  # type: ignore[index]  # trees key apart from files: both trees, or one
                yield from self._diff(a[2] if a else None, b[2] if b else None, path + "/", prefix)
                continue
            if prefix and not (path == prefix or path.startswith(prefix + "/")):
                continue
            yield (a[0] if a else ABSENT, b[0] if b else ABSENT, a[2] if a else _ZERO, b[2] if b else _ZERO, path)

    def _listed(self, tree: str | None) -> dict[bytes, tuple[str, str, str]]:
        """A tree's entries by git's sort key (a tree's name sorts as if it ended in '/')."""
        if tree is None:
            return {}
        got = self.entries(tree)
        if got is None:
            raise _Unsure(f"tree {tree}")
        return {
            name.encode("utf-8", "surrogateescape") + (b"/" if mode == TREE else b""): (mode, name, sha)
            for mode, name, sha in got
        }


def _plain_ref(name: str) -> bool:
    return (
        _PLAIN_REF.fullmatch(name) is not None
        and ".." not in name
        and "//" not in name
        and not name.endswith(("/", ".lock", "."))
        and not any(part.startswith(".") for part in name.split("/"))
    )


def open_repo(root: Path) -> Repo | None:
    """The repository holding `root` when this module reads it as git would, else None."""
    if any(os.environ.get(name) for name in _GIT_ENV):
        return None
    try:
        found = _plain_dirs(Path(os.path.abspath(root)))
        if found is None:
            return None
        repo = Repo(*found, None)
        if any(name.startswith("refs/replace/") for name in repo._packed_refs()):
            return None
        from gitdb.db import GitDB  # git's object store without GitPython

        repo.db = GitDB(str(repo.common / "objects"))
        return repo
    except (OSError, UnicodeDecodeError, _Unsure):
        return None


def _plain_dirs(start: Path) -> tuple[Path, Path, Path] | None:
    """(git dir, common dir, working tree) of the repository holding `start`, None when it is not plain."""
    found = _discover(start)
    if found is None:
        return None
    gitdir, top = found
    common = gitdir
    if (gitdir / "commondir").exists():
        common = (gitdir / (gitdir / "commondir").read_text("utf-8").strip()).resolve()
    if any((common / p).exists() for p in ("shallow", "info/grafts", "reftable", "refs/replace")):
        return None
    if not _plain_config(common / "config") or (gitdir / "config.worktree").exists():
        return None
    return gitdir, common, top


def release() -> None:
    """Unmap the pack windows gitdb keeps (a long-running process must not hold packs git gc removed)."""
    import sys

    util = sys.modules.get("gitdb.util")
    if util is not None:
        util.mman.collect()


def _discover(start: Path) -> tuple[Path, Path] | None:
    """(git dir, working tree) of the repository holding `start`: the first `.git` above it."""
    for folder in (start, *start.parents):
        dot = folder / ".git"
        if dot.is_dir():
            return dot, folder
        if dot.is_file():
            text = dot.read_text("utf-8").strip()
            if not text.startswith("gitdir: "):
                return None
            return (folder / text[8:].strip()).resolve(), folder
    return None


def _plain_config(path: Path) -> bool:
    """Whether the config sets nothing that changes what is read here (core.worktree, bare, extensions, includes)."""
    section = ""
    for raw in path.read_text("utf-8").splitlines():
        line = raw.split("#", 1)[0].split(";", 1)[0].strip().lower()
        if not line:
            continue
        if line.startswith("["):
            section = line.strip("[]").split()[0].split(".")[0].strip('"')
            if section in ("include", "includeif"):
                return False
            continue
        key, _, value = (part.strip() for part in line.partition("="))
        if section == "core" and (key == "worktree" or (key == "bare" and value in ("", "true", "yes", "on", "1"))):
            return False
        if section == "extensions" and key in ("objectformat", "refstorage") and value not in ("sha1", "files"):
            return False
    return True
