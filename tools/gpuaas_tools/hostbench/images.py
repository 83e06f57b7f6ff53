"""`gpuaas host image bench`: the figures of issue 11 (root: a loop device; curl installed).

pull_mib_s      `fetching.fetch` of a --size-mib image from a 127.0.0.1 server into a fresh
                cache (sha256 while streaming, fsync, rename): median MiB/s of --runs
curl_mib_s      `curl -s -o FILE` of the same URL from the same server, runs interleaved
pull_vs_curl    pull_mib_s / curl_mib_s
convert_ms      `BlockDisks.write_image` of the image as qcow2 onto a loop device through the
                disk guard: `qemu-img convert -n -f qcow2 -O raw` (median of --runs)
compare_ms      the read-back check that follows it (`qemu-img compare`), median

The image is incompressible (random) data, so qcow2 holds every cluster.
Everything is made under /var/tmp and removed on exit, the loop device
detached, also after an error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from host_reconciler import fetching, imagecache, images
from host_reconciler.drivers import disks, protocols
from schemas.errors import PermanentError

MiB = 1 << 20


def _run(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PermanentError(f"{' '.join(argv)}: {done.stderr.strip()}", code="bench.command_failed")
    return done.stdout.strip()


@contextmanager
def _server_process(served: Path) -> Iterator[str]:
    """The image server in a child process (both clients then time the same out-of-process server)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "host_reconciler.imageserver", str(served)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None  # noqa: S101 - stdout=PIPE above
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}/image.raw"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _write_random(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 8 * MiB))
            f.write(block)
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def run(*, size_mib: int, runs: int) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise PermanentError("the image bench needs root (a loop device)", code="bench.needs_root")
    for tool in ("curl", "qemu-img", "losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            raise PermanentError(f"{tool} is not installed", code="bench.missing_tool")
    size = size_mib * MiB
    with tempfile.TemporaryDirectory(prefix="gpuaas-imgbench-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        served = root / "served"
        served.mkdir()
        raw = served / "image.raw"
        digest = _write_random(raw, size)
        pull_s: list[float] = []
        curl_s: list[float] = []
        with _server_process(served) as url:
            for i in range(runs):
                cache = imagecache.ImageCache(root / f"cache-{i}")
                # Each client starts with no dirty pages: curl leaves 1 GiB to write back, which
                # would otherwise land on the next pull's fsync.
                os.sync()
                t = time.perf_counter()
                fetching.fetch(cache, url, digest, max_bytes=size)
                pull_s.append(time.perf_counter() - t)
                shutil.rmtree(cache.root)
                out = root / f"curl-{i}"
                os.sync()
                t = time.perf_counter()
                _run("curl", "-s", "-f", "--noproxy", "*", "-o", str(out), url)
                curl_s.append(time.perf_counter() - t)
                out.unlink()
        qcow2 = root / "image.qcow2"
        _run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2))
        raw.unlink()
        convert, compare = _convert(root, qcow2, size, runs)
    pull = statistics.median(pull_s)
    curl = statistics.median(curl_s)
    return {
        "size_bytes": size,
        "runs": runs,
        "pull_s": [round(x, 3) for x in pull_s],
        "curl_s": [round(x, 3) for x in curl_s],
        "pull_mib_s": round(size / MiB / pull, 1),
        "curl_mib_s": round(size / MiB / curl, 1),
        "pull_vs_curl": round(curl / pull, 3),
        "convert_ms": round(statistics.median(convert), 1),
        "compare_ms": round(statistics.median(compare), 1),
        "convert_ms_runs": convert,
    }


def _convert(root: Path, qcow2: Path, size: int, runs: int) -> tuple[list[float], list[float]]:
    by_id = root / "by-id"
    by_id.mkdir()
    devices: list[str] = []
    try:
        made: dict[str, str] = {}
        for name, mb in (("nvme-BENCH-OS", 16), ("nvme-BENCH-S0", size // MiB + 64)):
            backing = root / f"{name}.img"
            with backing.open("wb") as f:
                f.truncate(mb * MiB)
            dev = _run("losetup", "--find", "--show", str(backing))
            devices.append(dev)
            (by_id / name).symlink_to(dev)
            made[name] = f"/dev/disk/by-id/{name}"
        _run("mkfs.ext4", "-q", "-F", devices[0])
        driver = disks.BlockDisks(protocols.DiskSettings(by_id_root=by_id))
        slot = protocols.slot_disk(
            0,
            made["nvme-BENCH-S0"],
            [(0, made["nvme-BENCH-S0"])],
            made["nvme-BENCH-OS"],
            driver.identity_of(made["nvme-BENCH-S0"]),
        )  # approved as just made
        token = images.verify(qcow2, images.sha256_file(qcow2))
        convert: list[float] = []
        compare: list[float] = []
        for _ in range(runs):
            ev = driver.write_image(slot, token, digest=token.digest, image_format="qcow2")
            convert.append(float(ev["ms"]))
            compare.append(float(ev["verify"]["ms"]))
        return convert, compare
    finally:
        for dev in devices:
            subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)
