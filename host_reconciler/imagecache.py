"""The host's image cache: verified images addressed by content, with a size budget.

    <cache>/sha256/<hex>          a verified image (only ever renamed in whole, read-only)
    <cache>/partial/<hex>         a download in progress (resumed with an HTTP Range request)
    <cache>/partial/<hex>.json    where it comes from and how large it is (progress)
    <cache>/locks/<hex>.lock      one fetch per digest on this host (flock)

A file appears under `sha256/` only after its sha256 was computed while it
was written and equals its name (`fetching`); nothing else writes there, so
a name is the proof. "Last used" is the file's atime, set explicitly by
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
import json
import os
import re
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.errors import PermanentError, TemporaryError

_HEX = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_BYTES = 64 << 30  # seed 002: 64 GiB cap on one download


class CacheError(PermanentError):
    code = "host.image.cache"


def digest_hex(digest: str) -> str:
    """`sha256:HEX` or `HEX` -> HEX (64 lowercase hex characters), or CacheError."""
    hexpart = digest.removeprefix("sha256:")
    if not _HEX.match(hexpart):
        raise CacheError(f"{digest!r} is not a sha256 digest (sha256:<64 lowercase hex>)", code="host.image.bad_digest")
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

    def ensure(self) -> None:
        for d in (self.images_dir, self.partial_dir, self.root / "locks"):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    def path(self, digest: str) -> Path:
        return self.images_dir / digest_hex(digest)

    def partial(self, digest: str) -> Path:
        return self.partial_dir / digest_hex(digest)

    def partial_meta(self, digest: str) -> Path:
        return self.partial_dir / f"{digest_hex(digest)}.json"

    # -- reading -----------------------------------------------------------------------------
    def lookup(self, digest: str) -> CacheEntry | None:
        p = self.path(digest)
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        return CacheEntry(digest_hex(digest), str(p), st.st_size, st.st_atime)

    def entries(self) -> list[CacheEntry]:
        out: list[CacheEntry] = []
        with contextlib.suppress(FileNotFoundError):
            for p in self.images_dir.iterdir():
                if not _HEX.match(p.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = p.stat()
                    out.append(CacheEntry(p.name, str(p), st.st_size, st.st_atime))
        return sorted(out, key=lambda e: e.digest)

    def partials(self) -> list[PartialFetch]:
        out: list[PartialFetch] = []
        with contextlib.suppress(FileNotFoundError):
            for p in self.partial_dir.iterdir():
                if not _HEX.match(p.name):
                    continue
                meta: dict[str, Any] = {}
                with contextlib.suppress(OSError, ValueError):
                    loaded = json.loads(self.partial_meta(p.name).read_text())
                    meta = loaded if isinstance(loaded, dict) else {}
                with contextlib.suppress(FileNotFoundError):
                    total = meta.get("total")
                    out.append(PartialFetch(p.name, p.stat().st_size, total if isinstance(total, int) else None,
                                            str(meta["url"]) if meta.get("url") else None))  # fmt: skip
        return sorted(out, key=lambda f: f.digest)

    def used_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    # -- writing -----------------------------------------------------------------------------
    def touch(self, digest: str) -> None:
        """Mark the image used now (atime), keeping its mtime (the verified identity)."""
        p = self.path(digest)
        with contextlib.suppress(FileNotFoundError):
            st = p.stat()
            os.utime(p, ns=(time.time_ns(), st.st_mtime_ns))

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
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
                            code="host.image.fetch_busy",
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
                self.drop_partial(digest)
                return removed
        except TemporaryError:
            return False

    def enforce(
        self, *, budget: int, in_use: Collection[str], pinned: Collection[str], incoming: int = 0
    ) -> list[str]:
        """Evict least-recently-used images until `incoming` more bytes fit the budget; returns what went."""
        chosen = choose_evictions(self.entries(), budget=budget, in_use=in_use, pinned=pinned, incoming=incoming)
        return [d for d in chosen if self.evict(d)]


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
