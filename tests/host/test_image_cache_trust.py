"""The image cache trusts nothing on disk (issue 27): links, odd files and wrong bytes are never a hit.

<cache>/partial/<hex> -> /elsewhere   never written through (the target keeps its bytes)
<cache>/sha256/<hex>  -> /elsewhere   never a hit: removed, the image fetched and verified
<cache>/sha256/<hex>  wrong bytes     hashed again (no seal), removed, fetched
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from host_reconciler import fetching, imagecache


def _source(tmp_path: Path) -> tuple[str, str, bytes]:
    data = os.urandom(256 * 1024)
    src = tmp_path / "image.raw"
    src.write_bytes(data)
    return f"file://{src}", hashlib.sha256(data).hexdigest(), data


def test_a_link_planted_at_the_partial_file_is_never_written_through(tmp_path: Path) -> None:
    url, hexd, data = _source(tmp_path)
    cache = imagecache.ImageCache(tmp_path / "cache")
    cache.ensure()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, cache.partial(hexd))
    got = fetching.fetch(cache, url, hexd)
    assert victim.read_bytes() == b"precious"
    assert Path(got.entry.path).read_bytes() == data and not got.cached


def test_a_link_at_a_cached_name_is_never_a_hit(tmp_path: Path) -> None:
    url, hexd, data = _source(tmp_path)
    cache = imagecache.ImageCache(tmp_path / "cache")
    cache.ensure()
    other = tmp_path / "other"
    other.write_bytes(data)  # even the right bytes: a link is not the cache's own file
    os.symlink(other, cache.path(hexd))
    assert cache.lookup(hexd) is None
    got = fetching.fetch(cache, url, hexd)
    assert not got.cached and not os.path.islink(got.entry.path)
    assert Path(got.entry.path).read_bytes() == data and other.exists()


def test_a_cached_file_with_other_bytes_is_hashed_and_fetched_again(tmp_path: Path) -> None:
    url, hexd, data = _source(tmp_path)
    cache = imagecache.ImageCache(tmp_path / "cache")
    fetching.fetch(cache, url, hexd)
    assert fetching.fetch(cache, url, hexd).cached  # sealed: a hit
    path = cache.path(hexd)
    os.chmod(path, 0o644)
    path.write_bytes(b"x" * len(data))  # same size, other bytes: the seal no longer matches
    got = fetching.fetch(cache, url, hexd)
    assert not got.cached and path.read_bytes() == data


@pytest.mark.parametrize(
    "digest",
    [
        "a" * 64 + "\n",
        "sha256:" + "a" * 64 + "\n",
        "A" * 64,
        "a" * 63,
        "a" * 65,
        "sha256:" + "g" * 64,
    ],
)
def test_a_digest_is_exactly_64_lowercase_hex(digest: str) -> None:
    with pytest.raises(imagecache.CacheError):
        imagecache.digest_hex(digest)
