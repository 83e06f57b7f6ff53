"""Fetch an image by digest into the host cache: resumable, hashed while streaming, capped.

    fetch(cache, url, digest, max_bytes=...) -> CacheEntry

1. Under the digest's lock (`imagecache.ImageCache.lock`): a cached digest is
   a hit (touched, returned); a second fetch of the same digest waits for
   the first and then finds it cached, so an image is downloaded once.
2. Bytes go to `<cache>/partial/<hex>`. A partial file left by a dropped
   connection (this attempt, or a killed process) is hashed again from disk
   and continued with `Range: bytes=N-`; a server that answers 200 instead
   of 206 sends the whole file again and the partial restarts from zero.
   A dropped connection is retried `retries` times within one call.
3. The size is capped (`max_bytes`, default 64 GiB): a declared length over
   the cap is refused before a byte is written, and a stream that grows past
   it is cut off (`host.image.too_large`).
4. At the end the sha256 of exactly the bytes written must equal the
   digest: then fsync, read-only, atomic rename into `sha256/<hex>`, fsync
   of the directory. A mismatch deletes the partial file and raises
   `host.image.digest_mismatch` (permanent: the source serves other bytes).

Sources: `http://`, `https://` (urllib from the standard library: one GET
with a Range header is all this needs, and its errors map one to one onto
ours), and `file://` (labs, and images staged under the host's image dir).
A file source must be a regular file (never a device: a device path is
never taken from a user). Environment proxies are not used.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import logging
import os
import queue
import re
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from host_reconciler import codes as host_codes
from host_reconciler import imagecache
from host_reconciler.imagecache import CacheEntry, ImageCache
from host_reconciler.localstate import fsync_dir
from schemas.errors import PermanentError, TemporaryError

log = logging.getLogger("gpuaas.host")

CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")
_STAR_RANGE = re.compile(r"^bytes \*/(\d+)$")
PERMANENT_HTTP = frozenset({400, 401, 403, 404, 405, 410, 451})

Progress = Callable[[int, int | None], None]  # (bytes so far, total or None)
MakeRoom = Callable[[int], None]  # called with the bytes still to come before they are written


class FetchError(TemporaryError):
    code = host_codes.IMAGE_FETCH_FAILED


class DigestMismatch(PermanentError):
    code = host_codes.IMAGE_DIGEST_MISMATCH


class TooLarge(PermanentError):
    code = host_codes.IMAGE_TOO_LARGE


class SourceError(PermanentError):
    code = host_codes.IMAGE_SOURCE


@dataclass(frozen=True, slots=True)
class FetchResult:
    entry: CacheEntry
    downloaded: int  # bytes transferred by this call (0: cache hit)
    resumed_from: int  # bytes of a partial file that were kept
    attempts: int
    seconds: float
    cached: bool  # it was already in the cache

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.entry.as_dict(),
            "downloaded": self.downloaded,
            "resumed_from": self.resumed_from,
            "attempts": self.attempts,
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
        }


def check_url(url: str, *, allow_file: bool = True) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme in ("http", "https") and parts.hostname:
        return parts
    if parts.scheme == "file" and allow_file and parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        return parts
    allowed = "http(s)://HOST/... or file:///PATH" if allow_file else "http(s)://HOST/..."
    raise SourceError(f"image URL {url!r} is not {allowed}", code=host_codes.IMAGE_BAD_URL)


def fetch(
    cache: ImageCache,
    url: str,
    digest: str,
    *,
    max_bytes: int = imagecache.DEFAULT_MAX_BYTES,
    timeout_s: float = 60.0,
    retries: int = 5,
    progress: Progress | None = None,
    make_room: MakeRoom | None = None,
    keep_partial: bool = True,
    wait: bool = True,
    allow_file: bool = True,
) -> FetchResult:
    """Fetch `url` into `cache` as `digest` (see the module docstring)."""
    hexd = imagecache.digest_hex(digest)
    parts = check_url(url, allow_file=allow_file)
    t0 = time.monotonic()
    with cache.lock(hexd, wait=wait):
        hit = cache.lookup(hexd)
        if hit is not None:
            cache.touch(hexd)
            return FetchResult(hit, 0, 0, 0, time.monotonic() - t0, True)
        job = _Job(
            cache, url, parts, hexd, max_bytes=max_bytes, timeout_s=timeout_s, progress=progress, make_room=make_room
        )
        try:
            job.run(retries)
        except PermanentError:
            cache.drop_partial(hexd)
            raise
        except BaseException:
            if not keep_partial:
                cache.drop_partial(hexd)
            raise
        entry = cache.lookup(hexd)
        if entry is None:  # pragma: no cover - renamed just above under our lock
            raise FetchError(f"sha256:{hexd} vanished from the cache after its rename")
        cache.touch(hexd)
        return FetchResult(entry, job.downloaded, job.resumed_from, job.attempts, time.monotonic() - t0, False)


class _Restart(Exception):
    """The partial file cannot be continued: start again from byte 0."""


class _Job:
    def __init__(
        self,
        cache: ImageCache,
        url: str,
        parts: urllib.parse.SplitResult,
        hexd: str,
        *,
        max_bytes: int,
        timeout_s: float,
        progress: Progress | None,
        make_room: MakeRoom | None,
    ) -> None:
        self.cache, self.url, self.parts, self.hexd = cache, url, parts, hexd
        self.max_bytes, self.timeout_s = max_bytes, timeout_s
        self.progress, self.make_room = progress, make_room
        self.partial = cache.partial(hexd)
        self.hash = hashlib.sha256()
        self.have = 0
        self.total: int | None = None
        self.downloaded = 0
        self.resumed_from = 0
        self.attempts = 0
        self.room_made = False

    # -- the loop ------------------------------------------------------------------------------
    def run(self, retries: int) -> None:
        self.cache.ensure()
        fd = self._open_partial()
        try:
            while True:
                self.attempts += 1
                try:
                    if self._attempt(fd):
                        break
                except _Restart as e:
                    if self.attempts > retries:
                        raise FetchError(f"fetching {self.url}: the server's ranges do not continue the file") from e
                    self._reset(fd)
                    continue
                except (OSError, http.client.HTTPException) as e:
                    if self.attempts > retries:
                        raise FetchError(
                            f"fetching {self.url}: {_why(e)} after {self.attempts} attempt(s); "
                            f"{self.have} bytes kept for the next try",
                        ) from e
                    log.warning(
                        "image fetch %s: %s at %d bytes, resuming (attempt %d)",
                        self.url,
                        _why(e),
                        self.have,
                        self.attempts + 1,
                    )
                    time.sleep(min(2.0, 0.1 * self.attempts))
            got = self.hash.hexdigest()
            if got != self.hexd:
                raise DigestMismatch(
                    f"{self.url} served {self.have} bytes with sha256 {got}, not {self.hexd}; nothing was cached"
                )
            os.fsync(fd)
            os.fchmod(fd, 0o444)  # on the file written, never on whatever a path names now
            st = os.fstat(fd)
        finally:
            os.close(fd)
        # rename() replaces a name, never writes through it: a link planted at sha256/<hex> is just gone.
        os.replace(self.partial, self.cache.path(self.hexd))
        self.cache.seal(self.hexd, st)
        fsync_dir(self.cache.images_dir)
        with contextlib.suppress(FileNotFoundError):
            self.cache.partial_meta(self.hexd).unlink()

    def _open_partial(self) -> int:
        """The partial file, opened without following a link: a regular file left by an earlier try is
        hashed and continued; anything else there is removed and a new file made (O_EXCL)."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.partial, flags)
        except FileNotFoundError:
            fd = -1
        except OSError:  # a link (ELOOP), or something we may not open: never written through
            fd = -1
            self._remove_partial()
        if fd >= 0:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > self.max_bytes:
                os.close(fd)
                fd = -1
                self._remove_partial()
        if fd < 0:
            fd = os.open(self.partial, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.set_blocking(fd, True)
            return fd
        os.set_blocking(fd, True)
        while block := os.read(fd, CHUNK):
            self.hash.update(block)
        self.have = self.resumed_from = os.lseek(fd, 0, os.SEEK_CUR)
        return fd

    def _remove_partial(self) -> None:
        try:
            os.unlink(self.partial)
        except IsADirectoryError:
            import shutil

            shutil.rmtree(self.partial, ignore_errors=True)
        except FileNotFoundError:
            pass

    def _reset(self, fd: int) -> None:
        os.ftruncate(fd, 0)
        self.hash = hashlib.sha256()
        self.have = 0
        self.resumed_from = 0

    def _attempt(self, fd: int) -> bool:
        """One request from `have`; True when the whole body is in the partial file."""
        if self.parts.scheme == "file":
            return self._attempt_file(fd)
        # check_url admitted only http(s) here (file:// took the branch above).
        req = urllib.request.Request(self.url, headers={"User-Agent": "gpuaas-host", "Accept-Encoding": "identity"})  # noqa: S310
        if self.have:
            req.add_header("Range", f"bytes={self.have}-")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            resp = opener.open(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            with contextlib.closing(e):
                if e.code == 416 and self.have:  # our partial is at least the whole file
                    m = _STAR_RANGE.match(e.headers.get("Content-Range", "") or "")
                    if m and int(m.group(1)) == self.have:
                        self.total = self.have
                        return True
                    raise _Restart from e
                if e.code in PERMANENT_HTTP:
                    raise SourceError(f"{self.url}: HTTP {e.code} {e.reason}", code=host_codes.IMAGE_HTTP_ERROR) from e
                raise FetchError(f"{self.url}: HTTP {e.code} {e.reason}", code=host_codes.IMAGE_HTTP_ERROR) from e
        except urllib.error.URLError as e:
            reason = e.reason
            raise OSError(getattr(reason, "errno", None) or 0, f"cannot reach {self.url}: {reason}") from e
        with contextlib.closing(resp):
            start = 0
            length = resp.headers.get("Content-Length")
            if resp.status == 206:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", "") or "")
                if m is None or int(m.group(1)) != self.have:
                    raise _Restart
                start = self.have
                self.total = int(m.group(3)) if m.group(3) != "*" else None
            elif resp.status == 200:
                if self.have:
                    self._reset(fd)
                self.total = int(length) if length and length.isdigit() else None
            else:
                raise FetchError(f"{self.url}: unexpected HTTP {resp.status}", code=host_codes.IMAGE_HTTP_ERROR)
            self._start(fd, start)
            return self._stream(fd, resp)

    def _attempt_file(self, fd: int) -> bool:
        path = urllib.parse.unquote(self.parts.path)
        try:
            src = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise SourceError(f"cannot open {path}: {e.strerror}", code=host_codes.IMAGE_SOURCE_MISSING) from e
        with os.fdopen(src, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SourceError(f"{path} is not a regular file", code=host_codes.IMAGE_NOT_REGULAR)
            if self.have > st.st_size:
                raise _Restart
            self.total = st.st_size
            f.seek(self.have)
            self._start(fd, self.have)
            return self._stream(fd, f)

    def _start(self, fd: int, offset: int) -> None:
        if self.total is not None and self.total > self.max_bytes:
            raise TooLarge(f"{self.url} is {self.total} bytes, over the cap of {self.max_bytes}")
        if self.make_room is not None and not self.room_made:
            self.make_room((self.total - offset) if self.total is not None else 0)
            self.room_made = True
        os.lseek(fd, offset, os.SEEK_SET)
        meta = {"url": self.url, "total": self.total, "started_at": time.time()}
        with contextlib.suppress(OSError):
            imagecache.write_file(self.cache.partial_meta(self.hexd), json.dumps(meta).encode())

    def _stream(self, fd: int, body: IO[bytes] | http.client.HTTPResponse) -> bool:
        with _Hasher(self.hash) as hasher:  # every block fed is hashed before an error leaves here
            while True:
                block = body.read(CHUNK)
                if not block:
                    break
                if self.have + len(block) > self.max_bytes:
                    raise TooLarge(f"{self.url} sent more than the cap of {self.max_bytes} bytes")
                view = memoryview(block)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
                hasher.feed(block)
                self.have += len(block)
                self.downloaded += len(block)
                if self.progress is not None:
                    self.progress(self.have, self.total)
        if self.total is not None and self.have < self.total:
            raise http.client.IncompleteRead(b"", self.total - self.have)
        if self.total is not None and self.have > self.total:
            raise _Restart
        return True


class _Hasher:
    """sha256 on a second thread while the first reads and writes.

    hashlib drops the GIL while it hashes a large block, so hashing overlaps
    the socket read and the file write instead of adding to them (`gpuaas
    host image bench` measures pull throughput). A bounded queue keeps at most a
    few blocks in memory; leaving the block waits until every fed block is
    hashed, so `hash` always covers exactly the bytes written.
    """

    def __init__(self, h: Any) -> None:
        self._h = h
        self._q: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._t = threading.Thread(target=self._work, name="image-sha256", daemon=True)

    def _work(self) -> None:
        while (block := self._q.get()) is not None:
            self._h.update(block)

    def feed(self, block: bytes) -> None:
        self._q.put(block)

    def __enter__(self) -> _Hasher:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._q.put(None)
        self._t.join()


def _why(e: BaseException) -> str:
    if isinstance(e, http.client.IncompleteRead):
        return f"connection closed with {e.expected} bytes still expected"
    return f"{type(e).__name__}: {e}"


class ThrottledProgress:
    """A progress callback that logs at most every `every_s` seconds (and at the end)."""

    def __init__(self, what: str, every_s: float = 5.0, sink: Callable[[int, int | None], None] | None = None) -> None:
        self.what, self.every_s, self.sink = what, every_s, sink
        self._last = 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s and done != total:
            return
        self._last = now
        pct = f" ({100.0 * done / total:.1f}%)" if total else ""
        log.info("image fetch %s: %d/%s bytes%s", self.what, done, total if total is not None else "?", pct)
        if self.sink is not None:
            self.sink(done, total)
