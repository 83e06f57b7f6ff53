"""Safe file access for the portal bot (requests.py): regular files inside the repo only, never through a link.

Every directory below the repo root is opened with O_NOFOLLOW, one level at a
time; a new file is created with O_EXCL, an existing one is replaced by an
atomic rename of a file written beside it, never opened for writing.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from reconciler import codes as reconciler_codes
from schemas.errors import PermanentError

NOT_REGULAR = reconciler_codes.REQUEST_FILE_NOT_REGULAR
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _not_regular(rel: str, what: str) -> PermanentError:
    return PermanentError(
        f"{rel}: {what}; the portal bot writes only regular files inside the repo, never through a link",
        code=NOT_REGULAR,
    )


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise _not_regular(rel, "the path leaves the repo")
    return parts


def _name(rel: str) -> str:
    return _parts(rel)[-1]


@contextmanager
def _directory(root: Path, rel: str, *, create: bool) -> Iterator[int | None]:
    """The directory holding `rel` (relative to `root`), opened one level at a time without following a link.

    Yields its descriptor, or None when a directory is missing and `create` is
    False. The descriptor pins the directory that was checked: a link swapped
    in afterwards changes nothing the bot writes.
    """
    parts = _parts(rel)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise PermanentError(f"{root}: {e.strerror}", code=reconciler_codes.REQUEST_REPO) from e
    try:
        for i, part in enumerate(parts[:-1]):
            where = "/".join(parts[: i + 1])
            try:
                sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    yield None
                    return
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # made meanwhile (or a link put there): the open below decides
                except OSError as e:
                    raise PermanentError(f"{where}: {e.strerror}", code=reconciler_codes.REQUEST_FILE) from e
                sub = _open_dir(part, fd, where)
            except OSError as e:
                raise _dir_error(e, where) from e
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def _open_dir(part: str, parent: int, where: str) -> int:
    try:
        return os.open(part, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        raise _dir_error(e, where) from e


def _dir_error(e: OSError, where: str) -> PermanentError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        return _not_regular(where, "is a symlink or not a directory")
    return PermanentError(f"{where}: {e.strerror}", code=reconciler_codes.REQUEST_FILE)


def _existing(root: Path, rel: str) -> bool:
    """Whether `rel` is there as a regular file; a link or anything else on the way is refused."""
    with _directory(root, rel, create=False) as parent:
        mode = None if parent is None else _lmode(parent, rel)
    if mode is not None and not stat.S_ISREG(mode):
        raise _not_regular(rel, "is a symlink or not a regular file")
    return mode is not None


def _lmode(parent: int, rel: str) -> int | None:
    """st_mode of `rel` itself (a link is not followed), or None when nothing is there."""
    try:
        return os.stat(_name(rel), dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _read_regular(parent: int, rel: str) -> tuple[bytes, int]:
    """The bytes and permission bits of `rel`, a regular file with one link (anything else: refused)."""
    try:
        fd = os.open(_name(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _not_regular(rel, "is a symlink") from e
        raise PermanentError(f"{rel}: {e.strerror}", code=reconciler_codes.REQUEST_FILE) from e
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(rel, "is not a regular file")
        if st.st_nlink != 1:
            raise _not_regular(rel, f"has {st.st_nlink} hard links")
        return fh.read(), stat.S_IMODE(st.st_mode)


def _write_new(parent: int, name: str, data: bytes, mode: int | None) -> None:
    """Create `name` (O_EXCL: never over anything already there, a dangling link included) and write it."""
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError:
        _unlink(parent, name)
        raise


def _create(parent: int, rel: str, data: bytes) -> None:
    try:
        _write_new(parent, _name(rel), data, None)
    except FileExistsError as e:
        raise PermanentError(f"{rel} already exists", code=reconciler_codes.REQUEST_EXISTS) from e
    except OSError as e:
        raise PermanentError(f"{rel}: {e.strerror}", code=reconciler_codes.REQUEST_FILE) from e


def _replace(parent: int, rel: str, data: bytes, mode: int) -> None:
    """Replace `rel` atomically: write a new file beside it, then rename it over the name (never through it)."""
    tmp = f".{_name(rel)}.{secrets.token_hex(6)}.tmp"
    try:
        _write_new(parent, tmp, data, mode)
        os.replace(tmp, _name(rel), src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as e:
        _unlink(parent, tmp)
        raise PermanentError(f"{rel}: {e.strerror}", code=reconciler_codes.REQUEST_FILE) from e


def _remove(root: Path, rel: str) -> None:
    """Remove the request file `create` made (through the same link-refusing walk)."""
    with _directory(root, rel, create=False) as parent:
        if parent is not None:
            os.unlink(_name(rel), dir_fd=parent)


def _put_back(root: Path, rel: str, original: bytes, mode: int) -> None:
    with _directory(root, rel, create=False) as parent:
        if parent is None:
            raise PermanentError(f"{rel} is gone", code=reconciler_codes.REQUEST_FILE)
        _replace(parent, rel, original, mode)


def _unlink(parent: int, name: str) -> None:
    with suppress(OSError):
        os.unlink(name, dir_fd=parent)
