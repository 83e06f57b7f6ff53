"""Slot disks on real loop devices: refusals leave disks untouched; wipe + verify prove a clean disk.

by-id/nvme-OS  -> loop (ext4)           the OS disk: refused
by-id/nvme-S0  -> loop (ext4)           slot 0: wiped and verified
by-id/nvme-S1  -> loop (ext4, mounted)  slot 1: refused while mounted
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from host_reconciler import images, mountinfo
from host_reconciler.drivers import disks, protocols
from schemas.hostplans import DiskIdentity, ImageRef
from tests.host.conftest import Loop, Loops


def driver(loops: Loops) -> disks.BlockDisks:
    return disks.BlockDisks(protocols.DiskSettings(by_id_root=loops.by_id_root, sample_count=16))


def approval(loop: Loop) -> DiskIdentity:
    """What an approval of `loop` records (discovery of a loop device: backing file and size)."""
    return DiskIdentity(size_bytes=loop.backing.stat().st_size, backing_file=os.path.realpath(loop.backing))


def slot(
    i: int, loop: Loop, os_disk: str, approved: str | None = None, *, device: str | None = None
) -> protocols.SlotDisk:
    """Slot `i` whose approved disk is `loop` (named `device`, its by-id path unless given)."""
    by_id = device or loop.by_id
    return protocols.SlotDisk(i, by_id, approved if approved is not None else by_id, os_disk, approval(loop))


def blkid(dev: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["blkid", "-p", dev], capture_output=True, text=True, check=False)


def test_wipe_and_verify_clear_a_loop_disk_and_record_evidence(loops: Loops) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", 32, fs="ext4")
    with open(s0.device, "r+b") as f:  # tenant data in the middle of the disk
        f.seek(20 << 20)
        f.write(b"tenant secret" * 1000)
    d = driver(loops)
    assert d.inspect(s0.by_id, os_disk=os_disk.by_id, probe=True).signatures
    wipe = d.wipe(slot(0, s0, os_disk.by_id))
    assert wipe["method"] in ("blkdiscard", "zeroout", "zero-fill")
    assert any("ext4" in s for s in wipe["signatures_before"])
    ev = d.verify(slot(0, s0, os_disk.by_id))
    assert ev["verified"] and ev["signature_clear"] and ev["sampled_zero"]
    assert ev["device"] == s0.by_id and ev["samples"] >= 16
    assert blkid(s0.device).returncode == 2  # nothing found
    data = s0.backing.read_bytes()
    assert data.count(0) == len(data)  # every byte, not only the samples
    assert blkid(os_disk.device).returncode == 0  # the OS disk still has its filesystem


def test_wipe_refuses_mounted_disk_and_leaves_it_untouched(loops: Loops) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s1 = loops.make("nvme-S1", fs="ext4")
    point = loops.mount(s1, mkfs=False)
    (point / "tenant.txt").write_text("still here")
    os.sync()
    d = driver(loops)
    for call in (d.wipe, d.verify, d.check):
        with pytest.raises(protocols.DiskRefused) as e:
            call(slot(1, s1, os_disk.by_id))
        assert e.value.code == "host.disk.mounted"
    assert (point / "tenant.txt").read_text() == "still here"
    # (no byte hash here: the mounted ext4 itself writes its journal)
    assert 'TYPE="ext4"' in blkid(s1.device).stdout
    assert d.inspect(s1.by_id, os_disk=os_disk.by_id, probe=True).mounted == (str(point),)


def test_wipe_refuses_the_os_disk_and_leaves_it_untouched(loops: Loops) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    before = os_disk.sha256()
    d = driver(loops)
    # Even when a (bad) plan approves the OS disk as a slot disk.
    with pytest.raises(protocols.DiskRefused) as e:
        d.wipe(slot(0, os_disk, os_disk.by_id))
    assert e.value.code == "host.disk.os_disk"
    # A second by-id name for the same device is still the OS disk.
    (loops.by_id_root / "nvme-alias").symlink_to(os_disk.device)
    with pytest.raises(protocols.DiskRefused) as e:
        d.wipe(slot(0, os_disk, os_disk.by_id, device="/dev/disk/by-id/nvme-alias"))
    assert e.value.code == "host.disk.os_disk"
    assert os_disk.sha256() == before
    assert blkid(os_disk.device).returncode == 0


@pytest.mark.parametrize(
    ("device", "approved", "code"),
    [
        ("/dev/disk/by-id/nvme-S0", "/dev/disk/by-id/nvme-S9", "host.disk.not_approved"),
        ("/dev/disk/by-id/nvme-S0", None, "host.disk.not_approved"),
        ("/dev/loop0", "/dev/loop0", "host.disk.not_by_id"),
        ("/dev/disk/by-id/../../loop0", "/dev/disk/by-id/../../loop0", "host.disk.not_by_id"),
        ("/dev/disk/by-id/nvme-S0;rm -rf", "/dev/disk/by-id/nvme-S0;rm -rf", "host.disk.not_by_id"),
        ("/dev/disk/by-id/nvme-gone", "/dev/disk/by-id/nvme-gone", "host.disk.missing"),
    ],
)
def test_wipe_refuses_paths_that_are_not_the_approved_by_id_disk(
    loops: Loops, device: str, approved: str | None, code: str
) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", fs="ext4")
    before = s0.sha256()
    with pytest.raises(protocols.DiskRefused) as e:
        driver(loops).wipe(protocols.SlotDisk(0, device, approved, os_disk.by_id))
    assert e.value.code == code
    assert s0.sha256() == before


def test_wipe_refuses_when_the_os_disk_cannot_be_resolved(loops: Loops) -> None:
    s0 = loops.make("nvme-S0", fs="ext4")
    before = s0.sha256()
    with pytest.raises(protocols.DiskRefused) as e:
        driver(loops).wipe(slot(0, s0, "/dev/disk/by-id/nvme-missing-os"))
    assert e.value.code == "host.disk.os_disk_unknown"
    assert s0.sha256() == before


def test_wipe_verify_fails_when_a_signature_survives(loops: Loops) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", fs="ext4")
    d = driver(loops)
    d.wipe(slot(0, s0, os_disk.by_id))
    subprocess.run(["mkfs.ext4", "-q", s0.device], check=True)  # something wrote after the wipe
    with pytest.raises(disks.VerifyFailed) as e:
        d.verify(slot(0, s0, os_disk.by_id))
    assert e.value.evidence["signature_clear"] is False and e.value.evidence["verified"] is False


def test_image_is_written_only_when_its_digest_matches(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    s0 = loops.make("nvme-S0", fs="ext4")
    img = tmp_path / "store" / "img.raw"
    img.parent.mkdir()
    img.write_bytes(os.urandom(1 << 20))
    digest = hashlib.sha256(img.read_bytes()).hexdigest()
    ref = ImageRef("x", "img.raw", digest, "raw")
    path = images.resolve(tmp_path / "store", ref)
    before = s0.sha256()
    with pytest.raises(images.ImageError) as e:
        images.verify(path, "0" * 64)
    assert e.value.code == "host.image.digest_mismatch"
    token = images.verify(path, digest)
    img.write_bytes(os.urandom(1 << 20))  # the cached file changed after verification
    with pytest.raises(images.ImageError):
        driver(loops).write_image(slot(0, s0, os_disk.by_id), token, digest=digest, image_format="raw")
    assert s0.sha256() == before
    good = os.urandom(1 << 20)
    img.write_bytes(good)
    digest = hashlib.sha256(good).hexdigest()
    ev = driver(loops).write_image(
        slot(0, s0, os_disk.by_id), images.verify(path, digest), digest=digest, image_format="raw"
    )
    assert ev["bytes"] == len(good)
    assert s0.backing.read_bytes()[: len(good)] == good


@pytest.mark.parametrize("ref", ["/etc/passwd", "../../etc/passwd", "a/../../b", ""])
def test_image_refs_stay_inside_the_image_store(tmp_path: Path, ref: str) -> None:
    with pytest.raises(images.ImageError):
        images.resolve(tmp_path, ImageRef("x", ref, "0" * 64, "raw"))


def test_mountinfo_parsing_handles_escapes() -> None:
    text = "36 35 7:3 / /mnt/with\\040space rw,relatime shared:1 - ext4 /dev/loop3 rw\n"
    (m,) = mountinfo.parse_mountinfo(text)
    assert (m.majmin, m.mount_point, m.source) == ("7:3", "/mnt/with space", "/dev/loop3")
