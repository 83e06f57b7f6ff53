"""Read the files of a working tree safely: regular files only, never through a symlink, never blocking.

A file comes back as its bytes or as `UnreadFile` (a symlink, a FIFO, a device,
an unreadable file), whose reason is reported at its path: loading never
stops at one bad file, and never reads outside the tree.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from desired import problems as p
from desired.reading.yamlio import MAX_FILE_BYTES

YAML_SUFFIXES = (".yaml", ".yml")
SKIP_DIRS = frozenset({".git", ".venv", ".gpuaas", "node_modules", "__pycache__"})


@dataclass(frozen=True, slots=True)
class UnreadFile:
    """A file that is not read at all: a symlink, a FIFO, a device (the reason is reported at its path)."""

    code: str
    message: str


FileData = bytes | UnreadFile


def blob_id(data: bytes) -> str:
    """git's name for these bytes (`git hash-object`): the cache key of a working-tree file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def read_regular(path: Path | str) -> FileData:
    """The bytes of a regular file, never following a symlink, never blocking on a FIFO or device.

    At most MAX_FILE_BYTES + 1 bytes are read (the reader refuses the file by
    size), so a file that grows while it is read cannot exhaust memory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return UnreadFile(p.FILE_SYMLINK, "is a symbolic link; only regular files inside the repo are read")
        return UnreadFile(p.FILE_UNREADABLE, f"cannot be read: {e.strerror}")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return UnreadFile(p.FILE_NOT_REGULAR, "is not a regular file (a FIFO, socket or device); it is not read")
        chunks: list[bytes] = []
        left = MAX_FILE_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError as e:
        return UnreadFile(p.FILE_UNREADABLE, f"cannot be read: {e.strerror}")
    finally:
        os.close(fd)


def is_read(rel: str) -> bool:
    """Whether `iter_directory` reads a file at this relative path ('/'-separated): a YAML name outside
    the directories it skips."""
    folder, _, _ = rel.rpartition("/")
    return rel.endswith(YAML_SUFFIXES) and _entered(folder)


@functools.lru_cache(maxsize=4096)  # a tree has few folders and many files
def _entered(folder: str) -> bool:
    return not folder or not any(d in SKIP_DIRS or d.startswith(".") for d in folder.split("/"))


def read_at(root: Path, rel: str) -> FileData | None:
    """What `iter_directory(root)` yields for the file at `rel` (`is_read`), None where it yields nothing.

    Only where no directory on the way is a symbolic link: `iter_directory`
    reports such a directory and never enters it.
    """
    path = os.path.join(root, rel)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return None  # a directory with a YAML name is walked, not read
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        pass  # it is there but cannot be looked at: read_regular says why, as the walk would
    return read_regular(path)


def iter_directory(root: Path) -> Iterator[tuple[str, FileData]]:
    """Yield (relative path, bytes or UnreadFile) for every YAML file under root, sorted.

    Symlinked directories are not entered; they are reported (as UnreadFile) so a
    link out of the repo is visible rather than silently skipped.
    """
    found: list[str] = []
    top = os.fspath(root)
    for dirpath, dirnames, filenames in os.walk(top):
        # One relpath per directory, not per file: relpath's two abspaths per file are a visible
        # part of the portal bot's request (reconciler.reconcile.requests reads the whole tree).
        base = os.path.relpath(dirpath, top)
        prefix = "" if base == "." else base + os.sep
        kept = []
        for d in sorted(dirnames):
            if d in SKIP_DIRS or d.startswith("."):
                continue
            if os.path.islink(os.path.join(dirpath, d)):
                found.append(prefix + d)
                continue
            kept.append(d)
        dirnames[:] = kept
        found.extend(prefix + name for name in filenames if name.endswith(YAML_SUFFIXES))
    for rel in sorted(found):
        path = os.path.join(top, rel)
        # Only a linked directory lacks the suffix: a file is never lstat'ed twice (read_regular refuses links).
        if not rel.endswith(YAML_SUFFIXES) and os.path.islink(path):
            yield rel, UnreadFile(p.FILE_SYMLINK, "is a symbolic link to a directory; its files are not read")
        else:
            yield rel, read_regular(path)
