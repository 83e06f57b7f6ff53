"""Read-only access to a host's filesystem under a root: `/` or a recorded tree.

Every reader in this package goes through `SysRoot`, so a recorded tree under
`examples/sysfs/` and the live `/sys` take exactly the same code path; only
the root differs. Nothing here opens a file for writing.

A sysfs attribute that is missing, unreadable or malformed reads as None (an
old kernel, a driver without that attribute, a permission the caller lacks):
discovery reports what it can see instead of failing on the first odd file.
The only hard error is a root that is not a host filesystem at all.
"""

from __future__ import annotations

import os
import stat

from host_reconciler import codes as host_codes
from schemas.errors import PermanentError

ROOT_MISSING = host_codes.DISCOVERY_ROOT_MISSING
ROOT_NOT_SYSFS = host_codes.DISCOVERY_ROOT_NOT_SYSFS

PCI_DEVICES = "sys/bus/pci/devices"


class SysRoot:
    """Paths relative to the root, as in `sys/bus/pci/devices` or `proc/self/mountinfo`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        self._real = os.path.realpath(self.root)
        self._devices = os.path.join(self._real, "sys", "devices") + os.sep

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> SysRoot:
        """A checked root: it must be a directory with `sys/bus/pci/devices` under it."""
        path = os.fspath(root)
        if not os.path.isdir(path):
            raise PermanentError(f"--sysfs-root {path}: no such directory", code=ROOT_MISSING)
        if not os.path.isdir(os.path.join(path, PCI_DEVICES)):
            hint = ""
            if os.path.isdir(os.path.join(path, "bus", "pci", "devices")):
                hint = f"; {path} looks like sys itself, pass the directory that contains it"
            raise PermanentError(
                f"--sysfs-root {path}: no {PCI_DEVICES} under it, so it is not a host root{hint}",
                code=ROOT_NOT_SYSFS,
            )
        return cls(path)

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def read(self, rel: str) -> str | None:
        try:
            with open(self.path(rel), encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except (OSError, ValueError):
            return None

    def read_int(self, rel: str, base: int = 10) -> int | None:
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    def read_bytes(self, rel: str, limit: int) -> bytes | None:
        """Up to `limit` bytes from the start of a regular file or a block device.

        Opened O_RDONLY: on a live host this reads a disk header and can never
        change it. Anything else (a FIFO, a directory, a socket) reads as None.
        """
        path = self.path(rel)
        try:
            st = os.stat(path)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISBLK(st.st_mode)):
                return None
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            chunks: list[bytes] = []
            left = limit
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def link_name(self, rel: str) -> str | None:
        """Last component of a symlink's target (`driver` -> "vfio-pci")."""
        path = self.path(rel)
        try:
            name = os.path.basename(os.readlink(path))
        except OSError:
            return None
        if name in ("", ".", ".."):
            # A link to an ancestor: resolve it rather than trust the spelling.
            name = os.path.basename(os.path.realpath(path))
        return name

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError:
            return []

    def exists(self, rel: str) -> bool:
        return os.path.lexists(self.path(rel))

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self.path(rel))

    def device_path(self, rel: str) -> tuple[str, ...]:
        """The chain under /sys/devices a sysfs entry resolves to, root complex first.

        A link that leaves /sys/devices of this root (a broken or absolute link
        in a recorded tree) gives an empty chain rather than a path elsewhere.
        """
        real = os.path.realpath(self.path(rel))
        if not real.startswith(self._devices):
            return ()
        return tuple(real[len(self._devices) :].split(os.sep))
