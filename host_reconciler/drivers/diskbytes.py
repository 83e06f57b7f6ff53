"""A block device's bytes for disks.py: its size, a hash of a prefix, an O_EXCL open, sampled reads.

Samples are read with O_DIRECT (the page cache would hide what the disk holds)
at the first and last MiB and at seeded random offsets.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator

from host_reconciler import codes as host_codes
from host_reconciler.drivers.protocols import DiskRefused

MiB = 1 << 20


def _device_size(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def _sha256_prefix(path: str, length: int) -> str:
    """sha256 of the first `length` bytes of `path`, read past the page cache (O_DIRECT where it can)."""
    h = hashlib.sha256()
    flags = os.O_RDONLY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | getattr(os, "O_DIRECT", 0))
    except OSError:
        fd = os.open(path, flags)
    block = 4 * MiB
    buf = mmap.mmap(-1, block)  # page aligned, as O_DIRECT wants
    try:
        left, off = length, 0
        while left:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                break
            take = min(n, left)
            h.update(memoryview(buf)[:take])
            left -= take
            off += take
    finally:
        buf.close()
        os.close(fd)
    return h.hexdigest()


def _open_excl(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_EXCL | os.O_CLOEXEC)
    except OSError as e:
        raise DiskRefused(f"{path} is in use ({e.strerror})", code=host_codes.HOST_DISK_IN_USE, device=path) from e


def _read_samples(path: str, *, count: int, sample_bytes: int, seed: int) -> tuple[list[int], list[int], int]:
    """Read first/last MiB and `count` random blocks (O_DIRECT): (offsets, nonzero, size)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0))
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        align = 4096
        sample = max(align, sample_bytes // align * align)
        offsets = sorted(set(_offsets(size, count=count, sample=sample, align=align, seed=seed)))
        nonzero: list[int] = []
        buf = mmap.mmap(-1, max(sample, MiB))
        try:
            for off in offsets:
                length = min(MiB if off in (0, max(0, size - MiB)) else sample, size - off)
                length = max(align, length // align * align)
                n = os.preadv(fd, [memoryview(buf)[:length]], off)
                if buf[:n].count(0) != n:
                    nonzero.append(off)
        finally:
            buf.close()
        return offsets, nonzero, size
    finally:
        os.close(fd)


def _offsets(size: int, *, count: int, sample: int, align: int, seed: int) -> Iterator[int]:
    if size <= MiB:
        yield 0
        return
    yield 0
    yield (size - MiB) // align * align
    rng = _Rng(seed)
    span = max(1, (size - sample) // align)
    for _ in range(count):
        yield rng.below(span) * align


class _Rng:
    """splitmix64: reproducible offsets from the recorded seed (audit can re-read them)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & (2**64 - 1)

    def below(self, n: int) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & (2**64 - 1)
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
        return (z ^ (z >> 31)) % n
