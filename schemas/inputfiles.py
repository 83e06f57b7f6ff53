"""Files a user names on the command line (`--ssh-key`, `--plan-file`, a saved plan, a config): read safely.

Such a file may be anything: a device that never ends (`/dev/zero`), a
FIFO nobody writes, a directory, a private key passed by mistake. So it is
opened without blocking, read only when it is a regular file, and never
past a bound the caller sets; every refusal is a PermanentError with the
caller's code, and none quotes the file's content (a secret passed by
mistake must not land in CI or portal logs).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from schemas.errors import PermanentError

KIB = 1024
MIB = 1024 * KIB


def read_bytes(path: Path, *, limit: int, code: str, what: str = "file") -> bytes:
    """The bytes of regular file `path`, at most `limit` of them; PermanentError(code) otherwise."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once (then refused below, unread).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise PermanentError(f"{what} {path}: cannot be read: {e.strerror or e}", code=code) from e
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise PermanentError(f"{what} {path} is a directory, not a file", code=code)
        if not stat.S_ISREG(st.st_mode):
            raise PermanentError(
                f"{what} {path} is not a regular file (a device, FIFO or socket); give the path of a file", code=code
            )
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise PermanentError(f"{what} {path} is {st.st_size} bytes, more than the {limit} allowed", code=code)
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise PermanentError(f"{what} {path}: cannot be read: {e.strerror or e}", code=code) from e
    if len(data) > limit:  # it grew while read
        raise PermanentError(f"{what} {path} is more than the {limit} bytes allowed", code=code)
    return data


def read_text(path: Path, *, limit: int, code: str, what: str = "file") -> str:
    """`read_bytes` as UTF-8 text; a file that is not UTF-8 is refused without quoting it."""
    data = read_bytes(path, limit=limit, code=code, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PermanentError(f"{what} {path} is not UTF-8 text (byte {e.start})", code=code) from e
