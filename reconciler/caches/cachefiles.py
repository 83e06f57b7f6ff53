"""The files beside the cache store's database: file records read safely, and who wrote a temp file.

`reconciler.caches.cachestore` keeps records too large for a row (kept PR-plan
bases, the service's status documents) as files named by their key. A file
is read only when it is ours, regular, private and of the recorded size; a
`.tmp` file names its writer (pid and start time), so a sweep removes only
those of writers that died.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import mmap
import os
import stat
from pathlib import Path
from typing import BinaryIO


class Unsafe(Exception):
    """A file or folder of the cache that another user could have written."""


def owned_private(st: os.stat_result, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise Unsafe(f"{what} belongs to another user (uid {st.st_uid})")
    if st.st_mode & 0o022:
        raise Unsafe(f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})")


class Damaged(Exception):
    """A part of a signed file record failed its check when it was read (the disk changed under it).

    Its bytes were never used; the client plans again without the record,
    which `Store.drop_file` has removed.
    """


class SignedFile:
    """A file record whose first bytes (`head`) were verified; the rest is read by offset, unverified.

    The file is mapped (read-only): its head is hashed and unpickled from the
    page cache without a copy, and the record may be replaced on disk
    meanwhile (a new file is renamed over it): these are still the bytes verified.
    """

    def __init__(self, mapped: mmap.mmap, signed: int) -> None:
        self._map, self.size = mapped, len(mapped)
        self.head = memoryview(mapped)[:signed]

    def read(self, at: int, length: int) -> bytes:
        """`length` bytes at offset `at` (the client checks them: only `head` is vouched for)."""
        if at < 0 or length < 0 or at + length > self.size:
            raise ValueError(f"{length} bytes at {at} lie outside the {self.size}-byte record")
        return self._map[at : at + length]

    def stream(self, at: int) -> mmap.mmap:
        """The file to read from offset `at` on (an unpickler reads the signed head from it)."""
        self._map.seek(at)
        return self._map

    def read_checked(self, at: int, length: int, digest: bytes) -> bytes:
        """`read`, when the bytes' SHA-256 is `digest` (from the signed head); Damaged otherwise."""
        data = self.read(at, length)
        if not hmac.compare_digest(hashlib.sha256(data).digest(), digest):
            self.on_damage()
            raise Damaged(f"a part of the cache record at byte {at} does not match its digest")
        return data

    def on_damage(self) -> None:
        """Set by the store: what removes the record once a part of it is found damaged."""

    def close(self) -> None:
        self.head.release()
        with contextlib.suppress(BufferError):  # a view still held: unmapped when the map goes
            self._map.close()

    def __del__(self) -> None:
        self.close()


def open_private(path: Path, size: int) -> BinaryIO | None:
    """A file of ours (regular, not writable by others, `size` long), open to read, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    try:
        owned_private(st, path.name)
    except Unsafe:
        f.close()
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        f.close()
        return None
    return f


def read_private(path: Path, size: int) -> bytes | None:
    """The bytes of a file of ours (regular, not writable by others, `size` long), or None."""
    f = open_private(path, size)
    if f is None:
        return None
    with f:
        data = f.read(size + 1)
    return data if len(data) == size else None


def start_time(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot, /proc), None when unknown or not running."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw.rpartition(b")")[2].split()  # after the command name, which may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


def writer_tag(pid: int) -> str:
    """`<pid>-<start time>`: names a writer uniquely, even once its pid is reused."""
    return f"{pid}-{start_time(pid) or 0}"


def writer_alive(tag: str) -> bool:
    """Whether the writer a temp file names still runs (an unreadable name counts as alive: kept)."""
    pid_text, _, started = tag.partition("-")
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # exists, another user's
    now = start_time(pid)
    return not (started and started != "0" and now is not None and now != started)  # pid reused: the writer died
