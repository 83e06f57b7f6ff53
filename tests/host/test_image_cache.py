"""The image cache: LRU eviction under a budget (in-use and pinned images stay), and the CLI.

<cache>/sha256/<hex>   last used = atime (set by `touch`)
    oldest ─────────────────────────────► newest
    A (pinned)   B   C (in use)   D        budget: room for two
    evicted: B (oldest evictable), then D if still over; A and C never
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from host_reconciler import imagecache
from host_reconciler.imagecache import CacheEntry, choose_evictions
from host_reconciler.imageserver import Fault, ImageServer
from reconciler import cli

H = {c: c * 64 for c in "abcdef"}


def entry(c: str, size: int, used: float) -> CacheEntry:
    return CacheEntry(H[c], f"/c/sha256/{H[c]}", size, used)


@pytest.mark.parametrize(
    ("story", "entries", "budget", "in_use", "pinned", "incoming", "evicted"),
    [
        ("under budget: nothing", [entry("a", 10, 1), entry("b", 10, 2)], 20, (), (), 0, []),
        (
            "over: least recently used first",
            [entry("a", 10, 3), entry("b", 10, 1), entry("c", 10, 2)],
            20,
            (),
            (),
            0,
            [H["b"]],
        ),
        (
            "in use and pinned are skipped",
            [entry("a", 10, 1), entry("b", 10, 2), entry("c", 10, 3), entry("d", 10, 4)],
            20,
            (H["c"],),
            (H["a"],),
            0,
            [H["b"], H["d"]],
        ),
        ("room for an incoming image", [entry("a", 10, 1), entry("b", 10, 2)], 25, (), (), 10, [H["a"]]),
        (
            "everything kept: over budget rather than evict a user",
            [entry("a", 10, 1), entry("b", 10, 2)],
            5,
            (H["a"],),
            (f"sha256:{H['b']}",),
            0,
            [],
        ),
        ("ties broken by digest", [entry("b", 10, 1), entry("a", 10, 1)], 10, (), (), 0, [H["a"]]),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_choose_evictions(  # noqa: PLR0917 -- one argument per parametrize column
    story: str,
    entries: list[CacheEntry],
    budget: int,
    in_use: tuple[str, ...],
    pinned: tuple[str, ...],
    incoming: int,
    evicted: list[str],
) -> None:
    assert choose_evictions(entries, budget=budget, in_use=in_use, pinned=pinned, incoming=incoming) == evicted


def put(cache: imagecache.ImageCache, size: int, used: float) -> str:
    data = os.urandom(size)
    hexd = hashlib.sha256(data).hexdigest()
    cache.ensure()
    p = cache.path(hexd)
    p.write_bytes(data)
    os.utime(p, (used, p.stat().st_mtime))
    return hexd


def test_enforce_removes_files_but_never_in_use_pinned_or_locked_ones(tmp_path: Path) -> None:
    cache = imagecache.ImageCache(tmp_path)
    now = time.time()
    pinned = put(cache, 4096, now - 400)
    old = put(cache, 4096, now - 300)
    in_use = put(cache, 4096, now - 200)
    busy = put(cache, 4096, now - 150)  # being written to a disk: its lock is held
    new = put(cache, 4096, now - 100)
    with cache.lock(busy):
        gone = cache.enforce(budget=2 * 4096, in_use={in_use}, pinned={pinned})
    assert gone == [old, new]
    assert {e.digest for e in cache.entries()} == {pinned, in_use, busy}


def test_touch_moves_an_image_to_most_recently_used(tmp_path: Path) -> None:
    cache = imagecache.ImageCache(tmp_path)
    now = time.time()
    a = put(cache, 10, now - 300)
    b = put(cache, 10, now - 200)
    mtime = cache.path(a).stat().st_mtime_ns
    cache.touch(a)
    assert cache.path(a).stat().st_mtime_ns == mtime  # the verified identity is kept
    assert cache.enforce(budget=10, in_use=(), pinned=()) == [b]


def test_the_cli_pulls_lists_and_evicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "served"
    root.mkdir()
    data = os.urandom(2 << 20)
    (root / "img.raw").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    cache_dir = tmp_path / "cache"
    with ImageServer(root) as srv:
        assert (
            cli.main(
                [
                    "host",
                    "image",
                    "pull",
                    "--url",
                    srv.url("img.raw"),
                    "--digest",
                    f"sha256:{digest}",
                    "--cache",
                    str(cache_dir),
                ]
            )
            == 0
        )
        path = capsys.readouterr().out.strip()
        assert path == str(cache_dir / "sha256" / digest) and Path(path).read_bytes() == data

        # a mismatch, an image over the cap, an HTTP error: exit 1 with the code, nothing left behind
        srv.faults["img.raw"] = Fault(corrupt=True)
        other = tmp_path / "other"
        for argv, code in (
            (["--url", srv.url("img.raw")], "host.image.digest_mismatch"),
            (["--url", srv.url("img.raw"), "--max-bytes", "1000"], "host.image.too_large"),
            (["--url", srv.url("missing.raw")], "host.image.http_error"),
        ):
            assert (
                cli.main(
                    [
                        "host",
                        "image",
                        "pull",
                        *argv,
                        "--digest",
                        f"sha256:{digest}",
                        "--cache",
                        str(other),
                        "-o",
                        "json",
                    ]
                )
                == 1
            )
            assert json.loads(capsys.readouterr().out)["error"]["code"] == code
            assert list((other / "sha256").iterdir()) == [] and list((other / "partial").iterdir()) == []
        srv.faults.clear()
        srv.faults["img.raw"] = Fault(drop_after=1 << 20, times=1)
        assert (
            cli.main(
                [
                    "host",
                    "image",
                    "pull",
                    "--url",
                    srv.url("img.raw"),
                    "--digest",
                    f"sha256:{digest}",
                    "--cache",
                    str(other),
                    "-o",
                    "json",
                ]
            )
            == 0
        )
        doc = json.loads(capsys.readouterr().out)
        assert doc["attempts"] == 2 and doc["resumed_from"] == 0 and doc["downloaded"] == len(data)

    assert cli.main(["host", "image", "list", "--cache", str(cache_dir), "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [i["digest"] for i in listed["images"]] == [f"sha256:{digest}"]
    assert listed["used_bytes"] == len(data)

    config = tmp_path / "host.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state"), "image_pins": [f"sha256:{digest}"]}))
    assert (
        cli.main(
            [
                "host",
                "image",
                "evict",
                "--cache",
                str(cache_dir),
                "--config",
                str(config),
                "--digest",
                f"sha256:{digest}",
            ]
        )
        == 1
    )  # pinned: kept
    assert "kept" in capsys.readouterr().err and (cache_dir / "sha256" / digest).exists()
    assert cli.main(["host", "image", "evict", "--cache", str(cache_dir), "--to-bytes", "0", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["evicted"] == [f"sha256:{digest}"]
    assert not (cache_dir / "sha256" / digest).exists()


def test_a_bad_digest_is_a_usage_error_with_a_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            ["host", "image", "pull", "--url", "http://127.0.0.1:9/x", "--digest", "md5:abc", "--cache", str(tmp_path)]
        )
        == 1
    )
    assert "host.image.bad_digest" in capsys.readouterr().err
    assert not (tmp_path / "sha256").exists()
