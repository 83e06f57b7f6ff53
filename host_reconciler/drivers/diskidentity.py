"""A block device's identity from sysfs (model, serial, wwid, size; a loop device's backing file), and what holds it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from schemas.hostplans import DiskIdentity

SECTOR_BYTES = 512  # sysfs `size` counts 512-byte sectors whatever the logical block size


def _children_and_holders(sys_dev: Path) -> set[str]:
    found: set[str] = set()
    for child in sys_dev.iterdir():
        if (child / "partition").exists():
            majmin = _read(child / "dev")
            if majmin:
                found.add(majmin)
                with contextlib.suppress(OSError):
                    found |= _holders(child)
    found |= _holders(sys_dev)
    return found


def _holders(sys_dev: Path, depth: int = 0) -> set[str]:
    out: set[str] = set()
    holders = sys_dev / "holders"
    if depth > 4 or not holders.is_dir():
        return out
    for h in holders.iterdir():
        real = Path(os.path.realpath(h))
        majmin = _read(real / "dev")
        if majmin:
            out.add(majmin)
            out |= _holders(real, depth + 1)
    return out


def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def read_identity(sysfs_root: Path, majmin: str) -> DiskIdentity:
    """The identity sysfs reports for block device MAJ:MIN (missing attributes read as None).

    NVMe: the namespace's `size` and `wwid`, its controller's (or native
    multipath subsystem's) `device/model` and `device/serial`; a loop device:
    `size` and `loop/backing_file`. Values are stripped, as discovery reads them.
    """
    base = sysfs_root / "dev" / "block" / majmin
    sectors = _read(base / "size")
    return DiskIdentity(
        size_bytes=int(sectors) * SECTOR_BYTES if sectors.isdigit() else 0,
        model=_read(base / "device" / "model") or None,
        serial=_read(base / "device" / "serial") or None,
        wwid=_read(base / "wwid") or None,
        backing_file=_read(base / "loop" / "backing_file") or None,
    )
