"""Fetching images into the host cache from a real HTTP server on 127.0.0.1 (a thread in the test).

ImageServer (127.0.0.1:<port>, Range-capable)  --HTTP-->  fetching.fetch  -->  <cache>/partial/<hex>
    faults: drop the connection halfway,                                      | sha256 == digest?
            serve other bytes, ignore Range                                   v
                                                                          <cache>/sha256/<hex>
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_reconciler import fetching, imagecache
from host_reconciler.imageserver import Fault, ImageServer

MiB = 1 << 20


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ImageServer, Path]]:
    root = tmp_path / "served"
    root.mkdir()
    with ImageServer(root) as srv:
        yield srv, root


def publish(root: Path, name: str, size: int = 3 * MiB) -> tuple[bytes, str]:
    data = os.urandom(size)
    (root / name).write_bytes(data)
    return data, hashlib.sha256(data).hexdigest()


def nothing_cached(cache: imagecache.ImageCache) -> bool:
    leftovers = list(cache.partial_dir.iterdir()) if cache.partial_dir.exists() else []
    return cache.entries() == [] and leftovers == []


def test_a_dropped_connection_is_resumed_with_range_and_verified(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    data, digest = publish(root, "img.raw")
    srv.faults["img.raw"] = Fault(drop_after=len(data) // 2, times=1)
    cache = imagecache.ImageCache(tmp_path / "cache")
    result = fetching.fetch(cache, srv.url("img.raw"), f"sha256:{digest}", max_bytes=8 * MiB)
    assert result.attempts == 2 and not result.cached
    assert [(s, r) for _, r, s in srv.stats.requests] == [(200, None), (206, f"bytes={len(data) // 2}-")]
    assert Path(result.entry.path) == cache.path(digest)
    assert Path(result.entry.path).read_bytes() == data
    assert os.stat(result.entry.path).st_mode & 0o222 == 0  # read-only once verified
    assert list(cache.partial_dir.iterdir()) == []


def test_a_partial_file_left_by_a_killed_fetch_is_continued(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    data, digest = publish(root, "img.raw")
    cache = imagecache.ImageCache(tmp_path / "cache")
    cache.ensure()
    cache.partial(digest).write_bytes(data[: MiB + 17])  # what an earlier, killed process wrote
    result = fetching.fetch(cache, srv.url("img.raw"), digest, max_bytes=8 * MiB)
    assert result.resumed_from == MiB + 17 and result.downloaded == len(data) - (MiB + 17)
    assert srv.stats.requests[0][1] == f"bytes={MiB + 17}-"
    assert cache.path(digest).read_bytes() == data


def test_a_server_that_ignores_range_restarts_the_partial(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    data, digest = publish(root, "img.raw")
    srv.faults["img.raw"] = Fault(ignore_range=True)
    cache = imagecache.ImageCache(tmp_path / "cache")
    cache.ensure()
    cache.partial(digest).write_bytes(data[:MiB])
    result = fetching.fetch(cache, srv.url("img.raw"), digest, max_bytes=8 * MiB)
    assert srv.stats.requests[0][2] == 200 and result.resumed_from == 0 and result.downloaded == len(data)
    assert cache.path(digest).read_bytes() == data


def test_wrong_bytes_are_a_permanent_mismatch_and_nothing_is_cached(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    _data, digest = publish(root, "img.raw")
    srv.faults["img.raw"] = Fault(corrupt=True)
    cache = imagecache.ImageCache(tmp_path / "cache")
    with pytest.raises(fetching.DigestMismatch) as e:
        fetching.fetch(cache, srv.url("img.raw"), digest, max_bytes=8 * MiB)
    assert e.value.code == "host.image.digest_mismatch"
    assert nothing_cached(cache)


def test_an_image_over_the_cap_is_refused_before_it_is_written(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    data, digest = publish(root, "img.raw")
    cache = imagecache.ImageCache(tmp_path / "cache")
    written: list[int] = []
    with pytest.raises(fetching.TooLarge) as e:
        fetching.fetch(
            cache,
            srv.url("img.raw"),
            digest,
            max_bytes=len(data) - 1,
            progress=lambda done, _total: written.append(done),
        )
    assert e.value.code == "host.image.too_large"
    assert nothing_cached(cache)
    assert written == []  # refused on the declared length, before a byte was written


def test_a_stream_without_a_declared_length_is_cut_at_the_cap(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    _data, digest = publish(root, "img.raw")
    srv.faults["img.raw"] = Fault(no_length=True)
    cache = imagecache.ImageCache(tmp_path / "cache")
    with pytest.raises(fetching.TooLarge) as e:
        fetching.fetch(cache, srv.url("img.raw"), digest, max_bytes=MiB + 1)
    assert "more than the cap" in e.value.message
    assert nothing_cached(cache)


def test_a_missing_image_is_an_http_error_with_nothing_cached(tmp_path: Path, served: tuple) -> None:
    srv, _root = served
    cache = imagecache.ImageCache(tmp_path / "cache")
    with pytest.raises(fetching.SourceError) as e:
        fetching.fetch(cache, srv.url("nope.raw"), "ab" * 32)
    assert e.value.code == "host.image.http_error" and "404" in e.value.message
    assert nothing_cached(cache)


def test_a_connection_that_keeps_dropping_keeps_its_partial_for_the_next_pass(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    data, digest = publish(root, "img.raw")
    srv.faults["img.raw"] = Fault(drop_after=MiB // 2, times=3)
    cache = imagecache.ImageCache(tmp_path / "cache")
    with pytest.raises(fetching.FetchError) as e:
        fetching.fetch(cache, srv.url("img.raw"), digest, retries=1)
    assert isinstance(e.value, fetching.TemporaryError)  # the next pass resumes
    assert cache.lookup(digest) is None
    assert cache.partial(digest).stat().st_size == MiB  # two dropped halves of a MiB, in order
    (progress,) = cache.partials()
    assert progress.total == len(data) and progress.bytes_done == MiB
    result = fetching.fetch(cache, srv.url("img.raw"), digest)  # the next pass: one more drop, then the rest
    assert result.resumed_from == MiB
    assert cache.path(digest).read_bytes() == data


def test_two_fetches_of_one_digest_download_it_once(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    data, digest = publish(root, "img.raw", 8 * MiB)
    cache = imagecache.ImageCache(tmp_path / "cache")
    results: list[fetching.FetchResult] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def one() -> None:
        start.wait()
        try:
            results.append(fetching.fetch(cache, srv.url("img.raw"), digest))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert sorted(r.cached for r in results) == [False, True]
    assert [s for _, _, s in srv.stats.requests] == [200] and srv.stats.body_bytes == len(data)


def test_a_busy_digest_is_a_temporary_error_without_waiting(tmp_path: Path, served: tuple) -> None:
    srv, root = served
    _data, digest = publish(root, "img.raw")
    cache = imagecache.ImageCache(tmp_path / "cache")
    with cache.lock(digest), pytest.raises(fetching.TemporaryError) as e:
        fetching.fetch(cache, srv.url("img.raw"), digest, wait=False)
    assert e.value.code == "host.image.fetch_busy"
    assert srv.stats.requests == []


def test_file_urls_take_regular_files_only(tmp_path: Path) -> None:
    data = os.urandom(MiB)
    src = tmp_path / "img.raw"
    src.write_bytes(data)
    cache = imagecache.ImageCache(tmp_path / "cache")
    digest = hashlib.sha256(data).hexdigest()
    assert cache.path(digest) == Path(fetching.fetch(cache, src.as_uri(), digest).entry.path)
    with pytest.raises(fetching.SourceError) as e:
        fetching.fetch(cache, "file:///dev/zero", "cd" * 32, max_bytes=MiB)
    assert e.value.code == "host.image.not_regular"
    with pytest.raises(fetching.SourceError) as e:
        fetching.fetch(cache, src.as_uri(), digest, allow_file=False)
    assert e.value.code == "host.image.bad_url"


@pytest.mark.parametrize("url", ["ftp://h/x", "http://", "file://remote/x", "/etc/passwd", "x"])
def test_only_http_and_local_file_urls(url: str) -> None:
    with pytest.raises(fetching.SourceError) as e:
        fetching.check_url(url)
    assert e.value.code == "host.image.bad_url"
