"""Writing cached images onto slot disks: raw copy and `qemu-img convert -O raw`, then read back.

Real qemu-img on real loop devices, with the disk guard in force:

    by-id/nvme-OS  -> loop (ext4)              the OS disk: never written
    by-id/nvme-S0  -> loop (filled with 0xFF)  slot 0: gets the image; what was there must not survive
    by-id/nvme-S1  -> loop (ext4, mounted)     slot 1: refused while mounted, left untouched
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from host_reconciler import fetching, imagecache, images
from host_reconciler.drivers import disks, protocols
from schemas.hostplans import DiskIdentity
from tests.host.conftest import Loop, Loops

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _qemu_img() -> None:
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img is not installed (make apt installs it)")


def driver(loops: Loops) -> disks.BlockDisks:
    return disks.BlockDisks(protocols.DiskSettings(by_id_root=loops.by_id_root))


def slot(loop: Loop, os_disk: Loop, index: int = 0) -> protocols.SlotDisk:
    approval = DiskIdentity(size_bytes=loop.backing.stat().st_size, backing_file=os.path.realpath(loop.backing))
    return protocols.slot_disk(index, loop.by_id, [(index, loop.by_id)], os_disk.by_id, approval)


def fill(loop: Loop, byte: int) -> None:
    size = loop.backing.stat().st_size
    with open(loop.device, "r+b") as f:
        f.write(bytes([byte]) * size)
        f.flush()
        os.fsync(f.fileno())


def device_prefix(loop: Loop, n: int) -> bytes:
    subprocess.run(["blockdev", "--flushbufs", loop.device], check=False)
    with open(loop.device, "rb") as f:
        return f.read(n)


def guest_bytes(size: int) -> bytes:
    """Random data with a zero run in the middle (a qcow2 leaves those clusters unallocated)."""
    third = size // 3
    return os.urandom(third) + bytes(third) + os.urandom(size - 2 * third)


def cached(tmp_path: Path, path: Path) -> images.VerifiedImage:
    """Put `path` into a cache the way the fetch phase does, and verify it as image_verify does."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    cache = imagecache.ImageCache(tmp_path / "cache")
    fetching.fetch(cache, path.as_uri(), digest)
    return images.verify(cache.path(digest), digest)


def test_raw_image_is_copied_and_read_back(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 16)
    fill(s0, 0xFF)
    data = guest_bytes(5 * MiB + 123)
    src = tmp_path / "img.raw"
    src.write_bytes(data)
    token = cached(tmp_path, src)
    ev = driver(loops).write_image(slot(s0, os_disk), token, digest=token.digest, image_format="raw")
    assert ev["bytes"] == len(data) and ev["format"] == "raw"
    assert ev["verify"]["method"] == "sha256" and ev["verify"]["identical"] is True
    assert ev["verify"]["sha256"] == token.digest
    assert device_prefix(s0, len(data)) == data  # read back here too, not only by the driver


def test_qcow2_image_is_converted_to_raw_and_compared(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 16)
    fill(s0, 0xFF)  # a zero run of the guest must reach the disk as zeros, not keep 0xFF
    data = guest_bytes(6 * MiB)
    raw = tmp_path / "guest.raw"
    raw.write_bytes(data)
    qcow2 = tmp_path / "guest.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    assert qcow2.stat().st_size < len(data)  # the zero run is not stored
    token = cached(tmp_path, qcow2)
    ev = driver(loops).write_image(slot(s0, os_disk), token, digest=token.digest, image_format="qcow2")
    assert ev["bytes"] == len(data)  # the virtual size
    assert ev["verify"]["method"] == "qemu-img compare" and ev["verify"]["identical"] is True
    assert device_prefix(s0, len(data)) == data
    assert device_prefix(s0, len(data) + MiB)[len(data) :] == b"\xff" * MiB  # nothing past the image


def test_a_bad_write_is_caught_by_the_read_back(loops: Loops, tmp_path: Path) -> None:
    """The compare is a real check: a disk that differs from the image is reported, not assumed."""
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 16)
    data = guest_bytes(2 * MiB)
    raw = tmp_path / "guest.raw"
    raw.write_bytes(data)
    qcow2 = tmp_path / "guest.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    token = cached(tmp_path, qcow2)
    d = driver(loops)
    dev = d.guard(slot(s0, os_disk))
    fill(s0, 0x5A)  # as if the convert had not written (or written elsewhere)
    for fmt, tok, method in (("qcow2", token, "qemu-img compare"), ("raw", cached(tmp_path, raw), "sha256")):
        with pytest.raises(disks.WriteVerifyFailed) as e:
            d._verify_written(tok, fmt, dev, len(data))
        assert e.value.code == "host.disk.write_verify_failed"
        assert e.value.evidence["method"] == method and e.value.evidence["identical"] is False


def test_a_qcow2_with_a_backing_file_is_never_converted(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 16)
    fill(s0, 0xFF)
    secret = tmp_path / "host-secret.raw"
    secret.write_bytes(b"host secret" * 100_000)
    overlay = tmp_path / "overlay.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(secret), str(overlay)], check=True
    )
    token = cached(tmp_path, overlay)
    with pytest.raises(images.ImageError) as e:
        driver(loops).write_image(slot(s0, os_disk), token, digest=token.digest, image_format="qcow2")
    assert e.value.code == "host.image.backing_file"
    assert device_prefix(s0, MiB) == b"\xff" * MiB


def test_a_qcow2_larger_than_the_disk_is_refused(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 16)
    fill(s0, 0xFF)
    big = tmp_path / "big.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(big), "64M"], check=True)
    token = cached(tmp_path, big)
    with pytest.raises(disks.PermanentError) as e:
        driver(loops).write_image(slot(s0, os_disk), token, digest=token.digest, image_format="qcow2")
    assert e.value.code == "host.disk.too_small"
    assert device_prefix(s0, MiB) == b"\xff" * MiB


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_the_guard_refuses_a_mounted_or_unapproved_disk(loops: Loops, tmp_path: Path, fmt: str) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 16)
    s1 = loops.make("nvme-S1", 16, fs="ext4")
    point = loops.mount(s1, mkfs=False)
    (point / "tenant.txt").write_text("still here")
    data = guest_bytes(MiB)
    raw = tmp_path / "g.raw"
    raw.write_bytes(data)
    src = raw
    if fmt == "qcow2":
        src = tmp_path / "g.qcow2"
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(src)], check=True)
    token = cached(tmp_path, src)
    d = driver(loops)
    before = {s0.device: s0.sha256(), os_disk.device: os_disk.sha256()}
    with pytest.raises(protocols.DiskRefused) as e:
        d.write_image(slot(s1, os_disk, 1), token, digest=token.digest, image_format=fmt)
    assert e.value.code == "host.disk.mounted"
    assert (point / "tenant.txt").read_text() == "still here"
    with pytest.raises(protocols.DiskRefused) as e:  # slot 0's disk, but the plan approved another one
        d.write_image(
            protocols.SlotDisk(0, s0.by_id, s1.by_id, os_disk.by_id), token, digest=token.digest, image_format=fmt
        )
    assert e.value.code == "host.disk.not_approved"
    with pytest.raises(protocols.DiskRefused) as e:
        d.write_image(slot(os_disk, os_disk), token, digest=token.digest, image_format=fmt)
    assert e.value.code == "host.disk.os_disk"
    assert {s0.device: s0.sha256(), os_disk.device: os_disk.sha256()} == before
