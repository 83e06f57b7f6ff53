"""Slot disks: guarded image writes, wipe, and the verification that frees a slot.

The rule (seeds 000 and 003, ARCHITECTURE.md): never touch a disk that is
mounted, is the OS disk, or is not the approved by-id path of the claimed
slot; never take a device path from a user. Every destructive call goes
through `guard`, which refuses unless all of these hold:

1. the device is the claimed slot's disk AND the plan's approved disk of
   that slot, spelled `/dev/disk/by-id/NAME` with a udev-safe NAME;
2. `NAME` resolves (under the configured by-id root) to a block device;
3. the approval recorded the disk's identity (SlotMap `nvme_identity`:
   model, serial, wwid, size; a loop device's backing file), or nothing is
   written (`host.disk.identity_missing`: the approval would bind a name,
   not a disk), and that block device's sysfs directory (`/sys/dev/block/MAJ:MIN`, which is
   `/sys/class/block/<name>`) reports the same values, field by field
   (`host.disk.identity_changed`): a by-id link re-pointed at another disk,
   or a drive swapped into the slot, is never written;
4. that block device, its partitions and its holders are not in
   /proc/self/mountinfo nor /proc/swaps;
5. it is not the OS disk, nor on the same whole disk as the OS disk;
6. the kernel lets us open it with O_EXCL (a mounted or held block device
   answers EBUSY), a last check the kernel itself enforces.

Release: `wipefs -a`, then `blkdiscard` (zeroing as fallback, also when a
discard does not read back as zeros), then `verify`: `blkid -p` finds no
filesystem or partition signature and sampled blocks (first and last MiB
plus random offsets, O_DIRECT) read back zero. Each step returns its
evidence; the host status carries it and the central reconciler frees the
slot only on verified evidence.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from desired.patterns import BY_ID_NAME_RE, BY_ID_PREFIX
from host_reconciler import codes as host_codes
from host_reconciler import images
from host_reconciler.drivers import tools
from host_reconciler.drivers.diskbytes import MiB, _device_size, _open_excl, _read_samples, _sha256_prefix
from host_reconciler.drivers.diskidentity import _children_and_holders, _read, read_identity
from host_reconciler.drivers.protocols import DiskRefused, DiskSettings, IdentityChanged, IdentityMissing, SlotDisk
from host_reconciler.mountinfo import parse_mountinfo
from host_reconciler.observations import DiskObs
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import DiskIdentity

_BY_ID_NAME = re.compile(BY_ID_NAME_RE)
BLKID_NOTHING_FOUND = 2  # `blkid -p` exit status when no signature was found


class WipeFailed(PermanentError):
    code = host_codes.DISK_WIPE_FAILED

    def __init__(self, message: str, *, code: str | None = None, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message, code=code)
        self.evidence = evidence or {}


class VerifyFailed(WipeFailed):
    code = host_codes.DISK_VERIFY_FAILED


class WriteVerifyFailed(PermanentError):
    """The disk does not read back as the image just written to it."""

    code = host_codes.DISK_WRITE_VERIFY_FAILED

    def __init__(self, message: str, *, evidence: dict[str, Any]) -> None:
        super().__init__(message)
        self.evidence = evidence


@dataclass(frozen=True, slots=True)
class _Dev:
    path: str  # resolved /dev node
    rdev: int
    majmin: str
    members: frozenset[str] = field(default_factory=frozenset)  # itself, partitions, holders
    whole: str = ""  # majmin of the whole disk


def by_id_name(device: str) -> str:
    """`/dev/disk/by-id/NAME` -> NAME, or DiskRefused."""
    if not device.startswith(BY_ID_PREFIX):
        raise DiskRefused(f"{device!r} is not a /dev/disk/by-id path", code=host_codes.DISK_NOT_BY_ID, device=device)
    name = device[len(BY_ID_PREFIX) :]
    if not _BY_ID_NAME.match(name):
        raise DiskRefused(f"{device!r} is not a udev by-id name", code=host_codes.DISK_NOT_BY_ID, device=device)
    return name


class BlockDisks:
    """The real DiskDriver over block devices, util-linux and qemu-img."""

    def __init__(self, settings: DiskSettings | None = None) -> None:
        self.settings = settings or DiskSettings()

    # -- identity --------------------------------------------------------------------------
    def _resolve(self, device: str) -> _Dev:
        link = self.settings.by_id_root / by_id_name(device)
        try:
            real = os.path.realpath(link, strict=True)
            st = os.stat(real)
        except OSError as e:
            raise DiskRefused(
                f"{device} does not resolve to a device ({e.strerror})",
                code=host_codes.DISK_MISSING,
                device=device,
            ) from e
        if not stat.S_ISBLK(st.st_mode):
            raise DiskRefused(
                f"{device} -> {real} is not a block device",
                code=host_codes.DISK_NOT_BLOCK,
                device=device,
            )
        majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        sys_dir = self.settings.sysfs_root / "dev" / "block" / majmin
        whole = majmin
        members = {majmin}
        try:
            sys_real = Path(os.path.realpath(sys_dir, strict=True))
            if (sys_real / "partition").exists():
                whole = _read(sys_real.parent / "dev") or majmin
            members |= _children_and_holders(sys_real)
        except OSError:
            pass  # no sysfs entry: only the node itself is checked
        return _Dev(real, st.st_rdev, majmin, frozenset(members), whole)

    def _mounts_of(self, dev: _Dev) -> tuple[str, ...]:
        try:
            mounts = parse_mountinfo(self.settings.mountinfo.read_text())
        except OSError as e:
            raise TemporaryError(f"cannot read {self.settings.mountinfo}: {e}", code=host_codes.DISK_MOUNTINFO) from e
        points: list[str] = []
        for m in mounts:
            hit = m.majmin in dev.members
            if not hit and m.source.startswith("/"):
                with contextlib.suppress(OSError):
                    st = os.stat(m.source)
                    hit = stat.S_ISBLK(st.st_mode) and f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" in dev.members
            if hit:
                points.append(m.mount_point)
        with contextlib.suppress(OSError):
            for line in self.settings.swaps.read_text().splitlines()[1:]:
                src = line.split()[0] if line.split() else ""
                with contextlib.suppress(OSError):
                    st = os.stat(src)
                    if stat.S_ISBLK(st.st_mode) and f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" in dev.members:
                        points.append(f"[swap {src}]")
        return tuple(points)

    def in_use_by_mount(self, device: str) -> tuple[str, ...]:
        return self._mounts_of(self._resolve(device))

    def identity_of(self, device: str) -> DiskIdentity:
        """What sysfs says about the block device `device` resolves to now."""
        return read_identity(self._identity_root, self._resolve(device).majmin)

    @property
    def _identity_root(self) -> Path:
        return self.settings.identity_root or self.settings.sysfs_root

    def _check_identity(self, disk: SlotDisk, dev: _Dev) -> None:
        seen = read_identity(self._identity_root, dev.majmin)
        if disk.identity is None:
            raise IdentityMissing(
                f"slot {disk.slot_index}: the approval of {disk.device} records no disk identity "
                f"(SlotMap nvme_identity); nothing was written",
                device=disk.device,
                evidence={
                    "device": disk.device,
                    "resolved": dev.path,
                    "identity": {"differs": [], "approved": None, "observed": seen.as_dict()},
                },
            )
        differs = disk.identity.differences(seen)
        if not differs:
            return
        detail = ", ".join(f"{f} {getattr(disk.identity, f)!r} -> {getattr(seen, f)!r}" for f in differs)
        raise IdentityChanged(
            f"slot {disk.slot_index}: {disk.device} now resolves to {dev.path}, which is not the approved "
            f"disk ({detail}); nothing was written",
            device=disk.device,
            evidence={
                "device": disk.device,
                "resolved": dev.path,
                "identity": {"differs": differs, "approved": disk.identity.as_dict(), "observed": seen.as_dict()},
            },
        )

    def _is_os_disk(self, dev: _Dev, os_disk: str) -> bool:
        try:
            os_dev = self._resolve(os_disk)
        except DiskRefused as e:
            raise DiskRefused(
                f"cannot resolve the OS disk {os_disk}: {e.message}; refusing to touch any disk",
                code=host_codes.DISK_OS_DISK_UNKNOWN,
                device=os_disk,
            ) from e
        return dev.whole == os_dev.whole or dev.majmin == os_dev.majmin or bool(dev.members & os_dev.members)

    def guard(self, disk: SlotDisk) -> _Dev:
        """Refuse unless `disk` may be written (see the module docstring)."""
        if disk.approved is None or disk.device != disk.approved:
            raise DiskRefused(
                f"slot {disk.slot_index}: {disk.device} is not the approved disk of this slot "
                f"({disk.approved or 'no approved disk'})",
                code=host_codes.DISK_NOT_APPROVED,
                device=disk.device,
            )
        dev = self._resolve(disk.device)
        self._check_identity(disk, dev)
        if self._is_os_disk(dev, disk.os_disk):
            raise DiskRefused(
                f"slot {disk.slot_index}: {disk.device} ({dev.path}) is the OS disk",
                code=host_codes.HOST_DISK_OS_DISK,
                device=disk.device,
            )
        mounted = self._mounts_of(dev)
        if mounted:
            raise DiskRefused(
                f"slot {disk.slot_index}: {disk.device} ({dev.path}) is mounted at {', '.join(mounted)}",
                code=host_codes.HOST_DISK_MOUNTED,
                device=disk.device,
            )
        try:
            fd = os.open(dev.path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
        except OSError as e:
            raise DiskRefused(
                f"slot {disk.slot_index}: {dev.path} is in use ({e.strerror})",
                code=host_codes.HOST_DISK_IN_USE,
                device=disk.device,
            ) from e
        os.close(fd)
        return dev

    def check(self, disk: SlotDisk) -> None:
        """Raise DiskRefused unless `disk` could be written now (nothing is written)."""
        self.guard(disk)

    # -- observation -----------------------------------------------------------------------
    def inspect(self, device: str, *, os_disk: str, probe: bool) -> DiskObs:
        try:
            dev = self._resolve(device)
        except DiskRefused:
            return DiskObs(device=device, present=False)
        try:
            is_os = self._is_os_disk(dev, os_disk)
        except DiskRefused:
            is_os = False
        mounted = self._mounts_of(dev)
        sigs = self._signatures(dev.path) if probe and not mounted else None
        return DiskObs(device=device, present=True, mounted=mounted, signatures=sigs, os_disk=is_os)

    def _signatures(self, path: str) -> tuple[str, ...]:
        res = tools.run(["blkid", "-p", "-o", "export", "--", path], timeout=60)
        if res.returncode == BLKID_NOTHING_FOUND:
            return ()
        if res.returncode != 0:
            raise TemporaryError(f"blkid -p {path} failed: {res.stderr.strip()}", code=host_codes.DISK_BLKID)
        kv = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        found = [f"{k}={kv[k]}" for k in ("TYPE", "PTTYPE", "USAGE") if k in kv]
        return tuple(found) or ("unknown-signature",)

    # -- destructive -----------------------------------------------------------------------
    def write_image(
        self, disk: SlotDisk, image: images.VerifiedImage, *, digest: str, image_format: str
    ) -> dict[str, Any]:
        """Write the verified image; re-hash first if the file changed since it was verified."""
        if image.digest != digest:
            raise images.ImageError(
                f"verified digest {image.digest} is not the claim's {digest}",
                code=host_codes.IMAGE_DIGEST_MISMATCH,
            )
        if not image.still_valid():
            image = images.verify(Path(image.path), digest)
        if image_format not in images.FORMATS:
            raise images.ImageError(f"cannot write a {image_format!r} image", code=host_codes.IMAGE_FORMAT)
        virtual = self._qcow2_size(image.path) if image_format == "qcow2" else image.size
        dev = self.guard(disk)
        t0 = time.monotonic()
        if image_format == "qcow2":
            size = _device_size(dev.path)
            if virtual > size:
                raise PermanentError(
                    f"image {image.path} is {virtual} B (virtual), larger than {dev.path} ({size} B)",
                    code=host_codes.DISK_TOO_SMALL,
                )
            res = tools.run(
                ["qemu-img", "convert", "-n", "-f", "qcow2", "-O", "raw", "--", image.path, dev.path],
                timeout=self.settings.tool_timeout_s,
            )
            if res.returncode != 0:
                raise PermanentError(
                    f"qemu-img convert to {dev.path} failed: {res.stderr.strip()}",
                    code=host_codes.DISK_WRITE_FAILED,
                )
            written = virtual
        else:
            written = self._copy_raw(Path(image.path), dev)
        write_ms = round((time.monotonic() - t0) * 1000, 1)
        check = self._verify_written(image, image_format, dev, written)
        return {
            "device": disk.device,
            "resolved": dev.path,
            "image": image.path,
            "digest": digest,
            "format": image_format,
            "bytes": written,
            "ms": write_ms,
            "verify": check,
        }

    def _qcow2_size(self, path: str) -> int:
        """The virtual size of a qcow2 we may convert: no backing file, no external data file."""
        res = tools.run(["qemu-img", "info", "--output=json", "-f", "qcow2", "--", path], timeout=120)
        if res.returncode != 0:
            raise images.ImageError(
                f"{path} is not a readable qcow2: {res.stderr.strip()}", code=host_codes.IMAGE_FORMAT
            )
        try:
            info = json.loads(res.stdout)
            size = int(info["virtual-size"])
        except (ValueError, KeyError, TypeError) as e:
            raise images.ImageError(f"qemu-img info {path}: unreadable answer", code=host_codes.IMAGE_FORMAT) from e
        data = (info.get("format-specific") or {}).get("data") or {}
        if info.get("backing-filename") or info.get("full-backing-filename") or data.get("data-file"):
            # Converting would read another file of this host into a tenant's disk.
            raise images.ImageError(
                f"{path} names a backing or data file; only self-contained qcow2 images are written",
                code=host_codes.IMAGE_BACKING_FILE,
            )
        return size

    def _verify_written(self, image: images.VerifiedImage, image_format: str, dev: _Dev, length: int) -> dict[str, Any]:
        """Read back what was written: the raw bytes hash to the digest, or `qemu-img compare` agrees."""
        t0 = time.monotonic()
        detail: dict[str, Any]
        if image_format == "raw":
            got = _sha256_prefix(dev.path, length)
            ok, detail = got == image.digest, {"method": "sha256", "sha256": got}
        else:
            target = json.dumps(
                {"driver": "raw", "size": length, "file": {"driver": "host_device", "filename": dev.path}}
            )
            res = tools.run(
                ["qemu-img", "compare", "-f", "qcow2", "--", image.path, f"json:{target}"],
                timeout=self.settings.tool_timeout_s,
            )
            ok = res.returncode == 0
            detail = {"method": "qemu-img compare", "rc": res.returncode, "output": (res.stdout + res.stderr).strip()}
        evidence = {**detail, "bytes": length, "identical": ok, "ms": round((time.monotonic() - t0) * 1000, 1)}
        if not ok:
            raise WriteVerifyFailed(
                f"{dev.path} does not read back as image {image.path} ({detail['method']})", evidence=evidence
            )
        return evidence

    def _copy_raw(self, src: Path, dev: _Dev) -> int:
        fd = _open_excl(dev.path, os.O_WRONLY)
        written = 0
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            if src.stat().st_size > size:
                raise PermanentError(
                    f"image {src} ({src.stat().st_size} B) is larger than {dev.path} ({size} B)",
                    code=host_codes.DISK_TOO_SMALL,
                )
            os.lseek(fd, 0, os.SEEK_SET)
            with src.open("rb") as f:
                while block := f.read(4 * MiB):
                    view = memoryview(block)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                        written += n
            os.fsync(fd)
        finally:
            os.close(fd)
        return written

    def wipe(self, disk: SlotDisk) -> dict[str, Any]:
        dev = self.guard(disk)
        t0 = time.monotonic()
        evidence: dict[str, Any] = {
            "device": disk.device,
            "resolved": dev.path,
            "signatures_before": list(self._signatures(dev.path)),
        }
        wf = tools.run(["wipefs", "--all", "--", dev.path], timeout=self.settings.tool_timeout_s)
        evidence["wipefs"] = wf.as_dict()
        if wf.returncode != 0:
            raise WipeFailed(f"wipefs {dev.path} failed: {wf.stderr.strip()}", evidence=evidence)
        bd = tools.run(["blkdiscard", "--", dev.path], timeout=self.settings.tool_timeout_s)
        evidence["blkdiscard"] = bd.as_dict()
        method = "blkdiscard"
        if bd.returncode != 0 or not self._samples_zero(dev.path, count=8):
            # No discard support, or a discard that does not read back as zeros.
            zo = tools.run(["blkdiscard", "--zeroout", "--", dev.path], timeout=self.settings.tool_timeout_s)
            evidence["zeroout"] = zo.as_dict()
            method = "zeroout"
            if zo.returncode != 0:
                self._zero_fill(dev.path)
                method = "zero-fill"
        evidence.update(method=method, wiped_at=_now(), ms=round((time.monotonic() - t0) * 1000, 1))
        return evidence

    def _zero_fill(self, path: str) -> None:
        fd = _open_excl(path, os.O_WRONLY)
        try:
            size = os.lseek(fd, 0, os.SEEK_END)
            os.lseek(fd, 0, os.SEEK_SET)
            zeros = bytes(4 * MiB)
            left = size
            while left:
                n = os.write(fd, zeros[: min(left, len(zeros))])
                left -= n
            os.fsync(fd)
        finally:
            os.close(fd)

    def _samples_zero(self, path: str, *, count: int) -> bool:
        return not _read_samples(path, count=count, sample_bytes=self.settings.sample_bytes, seed=secrets.randbits(64))[
            1
        ]

    def verify(self, disk: SlotDisk) -> dict[str, Any]:
        dev = self.guard(disk)
        t0 = time.monotonic()
        res = tools.run(["blkid", "-p", "-o", "export", "--", dev.path], timeout=120)
        seed = secrets.randbits(64)
        offsets, nonzero, size = _read_samples(
            dev.path,
            count=self.settings.sample_count,
            sample_bytes=self.settings.sample_bytes,
            seed=seed,
        )
        clean = res.returncode == BLKID_NOTHING_FOUND and not res.stdout.strip()
        evidence: dict[str, Any] = {
            "device": disk.device,
            "resolved": dev.path,
            "size_bytes": size,
            "blkid_p": {"rc": res.returncode, "output": res.stdout.strip()},
            "signature_clear": clean,
            "samples": len(offsets),
            "sample_bytes": self.settings.sample_bytes,
            "sample_seed": seed,
            "nonzero_offsets": nonzero[:16],
            "sampled_zero": not nonzero,
            "verified": clean and not nonzero,
            "verified_at": _now(),
            "ms": round((time.monotonic() - t0) * 1000, 1),
        }
        if not evidence["verified"]:
            why = "blkid -p still finds a signature" if not clean else f"{len(nonzero)} sampled blocks are not zero"
            raise VerifyFailed(f"slot {disk.slot_index}: {disk.device}: {why}", evidence=evidence)
        return evidence


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
