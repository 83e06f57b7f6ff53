"""A lab host on one machine: what `gpuaas demo` and `gpuaas bench host` converge against.

    loop devices        one per approved slot disk + the OS disk, sparse files
    by-id/<name>        symlinks named as the plan names the disks (no udev here)
    netns gpuaas-l<id>  the management bridge, NAT and a real dnsmasq, made by the drivers
    libvirt             test:///<root>/node.xml (private per connection: one "host" each)
    sysfs tree          optional: a recorded host tree (examples/sysfs/) for PCI, NUMA
                        CPUs, hugepages, the discovery gate and disk identity: each slot
                        disk's loop device stands in for the namespace its by-id name
                        leads to in the tree (sys/dev/block/7:N -> that namespace), so the
                        guard reads the identity discovery recorded for the approval

Everything is removed on exit, also after an error: dnsmasq stopped, the
namespace deleted, mounts undone, loop devices detached.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host_reconciler import settings as hs
from host_reconciler.drivers import disks
from host_reconciler.drivers.dnsmasq import DnsmasqServer
from schemas.errors import PermanentError

TOOLS = ("losetup", "mkfs.ext4", "wipefs", "blkdiscard", "blkid", "ip", "iptables", "dnsmasq", "genisoimage")

NODE_XML = """<node>
  <cpu><mhz>2000</mhz><model>x86_64</model><active>{cpus}</active><nodes>{nodes}</nodes>
    <sockets>{nodes}</sockets><cores>{cores}</cores><threads>{threads}</threads></cpu>
  <memory>{memory_kib}</memory>
</node>
"""


class LabError(PermanentError):
    code = "lab.unavailable"


def check_host() -> None:
    if os.geteuid() != 0:
        raise LabError("a lab host needs root (loop devices, a network namespace)", code="lab.needs_root")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)} (make apt installs them)", code="lab.missing_tools")


def _run(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {done.stderr.strip()}", code="lab.command_failed")
    return done.stdout.strip()


def node_xml(path: Path, *, nodes: int = 2, cores: int = 56, threads: int = 2, memory_gib: int = 2048) -> str:
    """A libvirt test-driver host description; returns its URI."""
    path.write_text(
        NODE_XML.format(
            cpus=nodes * cores * threads, nodes=nodes, cores=cores, threads=threads, memory_kib=memory_gib << 20
        )
    )
    return f"test://{path}"


def publish_image(image_dir: Path, source_ref: str, size: int = 4 << 20) -> str:
    """A raw stand-in image under the host cache at `source_ref`; returns its sha256."""
    path = image_dir / source_ref
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"\xeb\x63\x90GPUAAS-DEMO-IMAGE" + os.urandom(size - 20)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def retag_tree(src: Path, dst: Path, old: str, new: str) -> Path:
    """Copy a recorded sysfs tree, renaming disk identities `old` -> `new` (another host, same layout)."""
    shutil.copytree(src, dst, symlinks=True)
    for dirpath, dirnames, filenames in os.walk(dst):
        for name in filenames + dirnames:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink() and p.stat().st_size < 4096:
                with contextlib.suppress(UnicodeDecodeError):
                    text = p.read_text()
                    if old in text:
                        p.write_text(text.replace(old, new))
    for dirpath, dirnames, filenames in os.walk(dst, topdown=False):
        for name in filenames + dirnames:
            if old in name:
                os.rename(Path(dirpath) / name, Path(dirpath) / name.replace(old, new))
    return dst


@dataclass
class LabHost:
    node: str
    root: Path
    netns: str
    by_id_root: Path
    image_dir: Path
    devices: dict[str, str] = field(default_factory=dict)  # by-id path -> /dev/loopN
    mounts: list[Path] = field(default_factory=list)
    settings_doc: dict[str, Any] = field(default_factory=dict)
    sysfs_tree: Path | None = None

    def settings(self, **changes: Any) -> hs.HostSettings:
        return hs.from_dict(self.node, {**self.settings_doc, **changes})

    def add_disk(self, by_id: str, size_mb: int, fs: str | None = None) -> str:
        name = disks.by_id_name(by_id)
        backing = self.root / "disks" / f"{name}.img"
        backing.parent.mkdir(exist_ok=True)
        with backing.open("wb") as f:
            f.truncate(size_mb << 20)
        dev = _run("losetup", "--find", "--show", str(backing))
        self.devices[by_id] = dev
        (self.by_id_root / name).symlink_to(dev)
        if fs:
            _run(f"mkfs.{fs}", "-q", "-F", dev)
        return dev

    def stand_in(self, by_id: str) -> None:
        """Let the loop device of `by_id` read in the recorded tree as the disk `by_id` names there.

        The disk guard reads a slot disk's identity from sysfs_root/dev/block/MAJ:MIN;
        a recorded tree knows its NVMe namespaces by by-id name, a loop device by nothing.
        A name the tree does not know is left alone: it reads as no identity.
        """
        if self.sysfs_tree is None:
            return
        with contextlib.suppress(OSError):
            namespace = Path(os.readlink(self.sysfs_tree / "dev" / "disk" / "by-id" / disks.by_id_name(by_id))).name
            rdev = os.stat(self.devices[by_id]).st_rdev
            entry = self.sysfs_tree / "sys" / "dev" / "block" / f"{os.major(rdev)}:{os.minor(rdev)}"
            entry.symlink_to(f"../../class/block/{namespace}")

    def mount(self, by_id: str) -> Path:
        """Make an ext4 on the disk and mount it on the host (drift injection)."""
        dev = self.devices[by_id]
        _run("mkfs.ext4", "-q", "-F", dev)
        point = self.root / "mnt" / disks.by_id_name(by_id)
        point.mkdir(parents=True)
        _run("mount", dev, str(point))
        self.mounts.append(point)
        return point

    def close(self) -> None:
        with contextlib.suppress(Exception):
            DnsmasqServer(self.settings().dnsmasq_dir, netns_name=self.netns).stop()
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
        for point in reversed(self.mounts):
            subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
        for dev in self.devices.values():
            subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)


@contextlib.contextmanager
def lab_host(
    node: str,
    root: Path,
    *,
    disk_paths: Sequence[str],
    os_disk: str,
    disk_mb: int = 16,
    sysfs_tree: Path | None = None,
    **settings_doc: Any,
) -> Iterator[LabHost]:
    """A lab host whose disks carry the by-id names a plan uses; torn down on exit."""
    check_host()
    root.mkdir(parents=True, exist_ok=True)
    by_id = root / "by-id"
    by_id.mkdir(exist_ok=True)
    ns = f"gpuaas-l{uuid.uuid4().hex[:8]}"
    host = LabHost(node, root, ns, by_id, root / "images", sysfs_tree=sysfs_tree)
    try:
        _run("ip", "netns", "add", ns)
        host.add_disk(os_disk, 16, fs="ext4")
        for path in disk_paths:
            host.add_disk(path, disk_mb)
            host.stand_in(path)
        doc: dict[str, Any] = {
            "libvirt_uri": node_xml(root / "node.xml"),
            "state_dir": str(root / "state"),
            "image_dir": str(host.image_dir),
            "by_id_root": str(by_id),
            "netns": ns,
            "readiness": "none",
            "pci": "fake-vfio",
            "graceful_poll_s": 0.05,
            "wipe_sample_count": 32,
        }
        if sysfs_tree is not None:
            doc.update(pci="sysfs", sysfs_root=str(sysfs_tree / "sys"), discovery_root=str(sysfs_tree))
        doc.update(settings_doc)
        host.settings_doc = doc
        yield host
    finally:
        host.close()
