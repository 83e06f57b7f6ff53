"""The host's image cache: verified images addressed by content, with a size budget.

    <cache>/sha256/<hex>          a verified image (only ever renamed in whole, read-only)
    <cache>/partial/<hex>         a download in progress (resumed with an HTTP Range request)
    <cache>/partial/<hex>.json    where it comes from and how large it is (progress)
    <cache>/locks/<hex>.lock      one fetch per digest on this host (flock)
    <cache>/sealed/<hex>.json     the identity (device, inode, size, mtime) it had when verified

A file appears under `sha256/` only after its sha256 was computed while it
was written and equals its name (`fetching`), and its seal is recorded then.
Nothing on disk is trusted beyond that: a hit (`lookup`) is a regular file
(opened without following links) whose identity still equals its seal; a
file without a seal, or that changed since, is hashed again, and one that is
a link, not regular, or whose bytes are not its name is removed (a miss: it
is fetched again). Every file is created with O_NOFOLLOW (and O_EXCL where
it is new), so a link planted in the cache is never written through. "Last used" is the file's atime, set explicitly by
`touch` whenever a provision uses the image (never left to the mount's
atime policy).

Eviction is least-recently-used under a byte budget and never removes an
image a provisioning or active VM of this host's plan names, nor a pinned
one (`choose_evictions` is pure; `evict` removes under the digest's lock, so
an image being fetched or written is never removed under its user).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from host_reconciler import codes as host_codes
from schemas.errors import PermanentError, TemporaryError

_HEX = re.compile(r"[0-9a-f]{64}")  # always fullmatch: `$` would take a trailing newline
DEFAULT_MAX_BYTES = 64 << 30  # seed 002: 64 GiB cap on one download


class CacheError(PermanentError):
    code = host_codes.IMAGE_CACHE


def digest_hex(digest: str) -> str:
    """`sha256:HEX` or `HEX` -> HEX (64 lowercase hex characters), or CacheError."""
    hexpart = digest.removeprefix("sha256:") if isinstance(digest, str) else ""
    if not _HEX.fullmatch(hexpart):
        raise CacheError(
            f"{digest!r} is not a sha256 digest (sha256:<64 lowercase hex>)", code=host_codes.IMAGE_BAD_DIGEST
        )
    return hexpart


@dataclass(frozen=True, slots=True)
class CacheEntry:
    digest: str  # hex
    path: str
    size: int
    last_used: float  # epoch seconds (atime)

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": f"sha256:{self.digest}",
            "path": self.path,
            "size_bytes": self.size,
            "last_used": _iso(self.last_used),
        }


@dataclass(frozen=True, slots=True)
class PartialFetch:
    digest: str
    bytes_done: int
    total: int | None
    url: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "digest": f"sha256:{self.digest}",
            "bytes": self.bytes_done,
            "total": self.total,
            "percent": round(100.0 * self.bytes_done / self.total, 1) if self.total else None,
            "url": self.url,
        }


def _iso(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds")


class ImageCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def images_dir(self) -> Path:
        return self.root / "sha256"

    @property
    def partial_dir(self) -> Path:
        return self.root / "partial"

    @property
    def sealed_dir(self) -> Path:
        return self.root / "sealed"

    def ensure(self) -> None:
        for d in (self.images_dir, self.partial_dir, self.root / "locks", self.sealed_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                raise CacheError(
                    f"{d} is not a directory (a link?); the image cache refuses it", code=host_codes.IMAGE_CACHE_UNSAFE
                )

    def path(self, digest: str) -> Path:
        return self.images_dir / digest_hex(digest)

    def partial(self, digest: str) -> Path:
        return self.partial_dir / digest_hex(digest)

    def partial_meta(self, digest: str) -> Path:
        return self.partial_dir / f"{digest_hex(digest)}.json"

    # -- reading -----------------------------------------------------------------------------
    def lookup(self, digest: str) -> CacheEntry | None:
        """The verified image of `digest`, or None (a miss: whatever odd thing was there is removed).

        A regular file whose identity equals its seal is a hit; one without a
        seal, or changed since, is hashed again from the opened file.
        """
        hexd = digest_hex(digest)
        p = self.path(hexd)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError:  # a link (ELOOP) or worse: never read through
            self._discard(hexd, "is not a regular file")
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                ok = False
            elif self._seal_of(hexd) == _identity(st):
                ok = True
            else:
                ok = _sha256(f) == hexd
                if ok:
                    self.seal(hexd, st)
        if not ok:
            self._discard(hexd, "does not hold the bytes its name says")
            return None
        return CacheEntry(hexd, str(p), st.st_size, st.st_atime)

    def seal(self, digest: str, st: os.stat_result) -> None:
        """Record the identity a verified image has now (its bytes were just hashed equal to its name)."""
        hexd = digest_hex(digest)
        write_file(self.sealed_dir / f"{hexd}.json", json.dumps(_identity(st)).encode())

    def _seal_of(self, hexd: str) -> list[int] | None:
        try:
            fd = os.open(self.sealed_dir / f"{hexd}.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            try:
                value = json.loads(f.read(4096))
            except ValueError:
                return None
        return value if isinstance(value, list) else None

    def _discard(self, hexd: str, why: str) -> None:
        import logging

        logging.getLogger("gpuaas.host").warning(
            "image cache: %s %s; removed, it will be fetched again", self.path(hexd), why
        )
        for p in (self.path(hexd), self.sealed_dir / f"{hexd}.json"):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
                p.unlink()

    def entries(self) -> list[CacheEntry]:
        out: list[CacheEntry] = []
        with contextlib.suppress(FileNotFoundError):
            for p in self.images_dir.iterdir():
                if not _HEX.fullmatch(p.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = os.lstat(p)
                    if stat.S_ISREG(st.st_mode):  # a link is no image (lookup removes it)
                        out.append(CacheEntry(p.name, str(p), st.st_size, st.st_atime))
        return sorted(out, key=lambda e: e.digest)

    def partials(self) -> list[PartialFetch]:
        out: list[PartialFetch] = []
        with contextlib.suppress(FileNotFoundError):
            for p in self.partial_dir.iterdir():
                if not _HEX.fullmatch(p.name):
                    continue
                meta: dict[str, Any] = {}
                with contextlib.suppress(OSError, ValueError):
                    loaded = json.loads(self.partial_meta(p.name).read_text())
                    meta = loaded if isinstance(loaded, dict) else {}
                with contextlib.suppress(FileNotFoundError):
                    total = meta.get("total")
                    out.append(
                        PartialFetch(
                            p.name,
                            p.stat().st_size,
                            total if isinstance(total, int) else None,
                            str(meta["url"]) if meta.get("url") else None,
                        )
                    )
        return sorted(out, key=lambda f: f.digest)

    def used_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    # -- writing -----------------------------------------------------------------------------
    def touch(self, digest: str) -> None:
        """Mark the image used now (atime), keeping its mtime (the verified identity)."""
        p = self.path(digest)
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.utime(p, ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)

    def drop_partial(self, digest: str) -> None:
        for p in (self.partial(digest), self.partial_meta(digest)):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    @contextlib.contextmanager
    def lock(self, digest: str, *, wait: bool = True, timeout_s: float | None = None) -> Iterator[None]:
        """Hold the digest's lock (one fetch, eviction or write of it at a time on this host).

        `wait=False`: TemporaryError `host.image.fetch_busy` if someone holds it.
        """
        self.ensure()
        path = self.root / "locks" / f"{digest_hex(digest)}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait and deadline is None else fcntl.LOCK_NB))
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if not wait or (deadline is not None and time.monotonic() >= deadline):
                        raise TemporaryError(
                            f"image sha256:{digest_hex(digest)} is being fetched or used by another process",
                            code=host_codes.IMAGE_FETCH_BUSY,
                            delay=5.0,
                        ) from e
                    time.sleep(0.1)
            yield
        finally:
            os.close(fd)  # releases the flock

    def evict(self, digest: str) -> bool:
        """Remove one cached image (and a partial of it) if nobody holds its lock; True if removed."""
        try:
            with self.lock(digest, wait=False):
                removed = False
                with contextlib.suppress(FileNotFoundError):
                    self.path(digest).unlink()
                    removed = True
                with contextlib.suppress(FileNotFoundError):
                    (self.sealed_dir / f"{digest_hex(digest)}.json").unlink()
                self.drop_partial(digest)
                return removed
        except TemporaryError:
            return False

    def enforce(self, *, budget: int, in_use: Collection[str], pinned: Collection[str], incoming: int = 0) -> list[str]:
        """Evict least-recently-used images until `incoming` more bytes fit the budget; returns what went."""
        chosen = choose_evictions(self.entries(), budget=budget, in_use=in_use, pinned=pinned, incoming=incoming)
        return [d for d in chosen if self.evict(d)]


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def _sha256(f: Any) -> str:
    h = hashlib.sha256()
    while block := f.read(1 << 20):
        h.update(block)
    return h.hexdigest()


def write_file(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a new file (O_EXCL, O_NOFOLLOW) renamed over it, never written through a link."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def choose_evictions(
    entries: Sequence[CacheEntry],
    *,
    budget: int,
    in_use: Collection[str],
    pinned: Collection[str],
    incoming: int = 0,
) -> list[str]:
    """The digests to evict, oldest use first, so that the cache plus `incoming` fits `budget`.

    Images in use or pinned are never chosen, even when that leaves the cache
    over budget (the caller decides what an overfull cache means).
    """
    keep = {digest_hex(d) for d in (*in_use, *pinned)}
    total = sum(e.size for e in entries) + incoming
    out: list[str] = []
    for e in sorted(entries, key=lambda e: (e.last_used, e.digest)):
        if total <= budget:
            break
        if e.digest in keep:
            continue
        out.append(e.digest)
        total -= e.size
    return out


def default_budget(root: Path) -> int:
    """Half the filesystem that holds the cache (the host setting `image_cache_bytes` overrides it)."""
    probe = root
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_blocks * st.f_frsize // 2


def free_bytes(root: Path) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize
