"""Pieces of the end-to-end guest: a Debian kernel, a busybox initramfs, a private libvirtd.

The initramfs is written here as a newc cpio archive (no cpio binary, no
root-owned staging tree). Its /init loads the virtio NIC, SCSI disk and ACPI
button modules of the host's Debian kernel, gets eth0's address with udhcpc,
writes a marker onto the slot disk (/dev/sda), answers TCP 22 with busybox
httpd and powers off on the ACPI power button (busybox acpid), which is what
libvirt's graceful shutdown presses. The files of a cloud-init seed's
`write_files` go into the initramfs at their paths (`seed_files`); when the
seed's announcer is among them, /init starts it and then creates
/var/lib/gpuaas/slice-ready, as a real image's unit and setup would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

MARKER = b"gpuaas-e2e: previous tenant data\n"
MARKER_OFFSET = 1 << 20  # the guest writes MARKER at 1 MiB into its slot disk

# Modules the guest needs, dependencies resolved from modules.dep. The crc
# providers go first: sd_mod's crc-t10dif/crc64-rocksoft look them up at load.
_MODULE_ROOTS = (
    "kernel/crypto/crct10dif_generic.ko",
    "kernel/crypto/crc64_rocksoft_generic.ko",
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/drivers/net/virtio_net.ko",
    "kernel/drivers/scsi/virtio_scsi.ko",
    "kernel/drivers/scsi/sd_mod.ko",
    "kernel/drivers/input/evdev.ko",
    "kernel/drivers/acpi/button.ko",
)

INIT = """#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /www /var/run /etc/acpi/PWRF
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec >/dev/console 2>&1
echo "gpuaas-e2e: init"
for m in $(cat /modules.order); do
  insmod "/modules/$m" || echo "gpuaas-e2e: insmod $m failed"
done
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done
ip link set eth0 up
until udhcpc -i eth0 -s /udhcpc.sh -t 5 -T 2 -n -q; do echo "gpuaas-e2e: dhcp retry"; done
i=0
while [ ! -b /dev/sda ] && [ $i -lt 100 ]; do sleep 0.2; i=$((i+1)); done
if dd if=/marker of=/dev/sda bs=512 seek=__SEEK__ conv=notrunc,fsync; then
  echo "gpuaas-e2e: marker written"
fi
acpid -c /etc/acpi -l /tmp/acpid.log
echo ok > /www/index.html
httpd -p 22 -h /www
echo "gpuaas-e2e: ready"
# What the seed installs (write_files) runs as its systemd unit would; the image's setup then drops the marker.
if [ -x /usr/local/sbin/gpuaas-slice-ready ]; then
  /usr/local/sbin/gpuaas-slice-ready &
  mkdir -p /var/lib/gpuaas
  touch /var/lib/gpuaas/slice-ready
  echo "gpuaas-e2e: marker /var/lib/gpuaas/slice-ready"
fi
while true; do sleep 3600; done
"""

UDHCPC = """#!/bin/sh
case "$1" in
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    [ -n "$router" ] && ip route replace default via "$router"
    echo "gpuaas-e2e: lease $ip"
    ;;
esac
exit 0
"""

POWER_BUTTON = """#!/bin/sh
echo "gpuaas-e2e: power button"
sync
poweroff -f
"""


@dataclass(frozen=True)
class Kernel:
    version: str
    vmlinuz: Path
    modules: Path


def find_kernel() -> Kernel | str:
    """The newest readable /boot/vmlinuz-* with its modules, or why there is none."""
    candidates = sorted(Path("/boot").glob("vmlinuz-*"), reverse=True)
    if not candidates:
        return "no /boot/vmlinuz-*: apt-get install linux-image-amd64 (in the Makefile's APT_PACKAGES)"
    for vmlinuz in candidates:
        version = vmlinuz.name.removeprefix("vmlinuz-")
        modules = Path("/lib/modules") / version
        if os.access(vmlinuz, os.R_OK) and (modules / "modules.dep").is_file():
            return Kernel(version, vmlinuz, modules)
    return f"no readable kernel with modules among {[str(c) for c in candidates]}"


def module_order(modules: Path) -> list[str]:
    """Module paths (relative to `modules`) in load order, dependencies first."""
    deps: dict[str, list[str]] = {}
    for line in (modules / "modules.dep").read_text().splitlines():
        name, _, rest = line.partition(":")
        deps[name] = rest.split()
    order: list[str] = []

    def visit(m: str) -> None:
        if m in order or m not in deps:
            return
        for d in reversed(deps[m]):  # modules.dep lists the deepest dependency last
            visit(d)
        order.append(m)

    for root in _MODULE_ROOTS:
        visit(root)
    return order


class _Cpio:
    """A newc ("070701") archive writer."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.ino = 1

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0)) -> None:
        fields = [self.ino, mode, 0, 0, 1, 0, len(data), 0, 0, rdev[0], rdev[1], len(name) + 1, 0]
        self.ino += 1
        header = b"070701" + b"".join(f"{f:08x}".encode() for f in fields)
        blob = header + name.encode() + b"\0"
        blob += b"\0" * (-len(blob) % 4)
        self.parts.append(blob + data + b"\0" * (-len(data) % 4))

    def dir(self, name: str) -> None:
        self._entry(name, 0o040755)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self._entry(name, 0o100000 | mode, data)

    def chardev(self, name: str, major: int, minor: int) -> None:
        self._entry(name, 0o020600, rdev=(major, minor))

    def bytes(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        out = b"".join(self.parts)
        return out + b"\0" * (-len(out) % 512)


def seed_files(user_data: bytes) -> dict[str, tuple[bytes, int]]:
    """A cloud-init user-data's `write_files` (the project's seeds are JSON below the header): path -> (data, mode)."""
    doc = json.loads(user_data.decode("utf-8").split("\n", 1)[1])
    return {
        f["path"]: (f["content"].encode("utf-8"), int(f.get("permissions", "0644"), 8))
        for f in doc.get("write_files", [])
    }


def build_initramfs(
    kernel: Kernel, dest: Path, *, sector: int, files: Mapping[str, tuple[bytes, int]] | None = None
) -> list[str]:
    """Write the initramfs to `dest` (with `files` at their absolute paths); return the module list it loads."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise FileNotFoundError("busybox")
    order = module_order(kernel.modules)
    cpio = _Cpio()
    dirs = ["bin", "dev", "modules", "proc", "sys", "tmp", "etc", "etc/acpi", "etc/acpi/PWRF"]
    for path in files or {}:
        for parent in reversed(Path(path.lstrip("/")).parents[:-1]):  # usr, usr/local, ... (not ".")
            if str(parent) not in dirs:
                dirs.append(str(parent))
    for d in dirs:
        cpio.dir(d)
    cpio.chardev("dev/console", 5, 1)
    cpio.file("bin/busybox", Path(busybox).read_bytes(), 0o755)
    cpio.file("init", INIT.replace("__SEEK__", str(sector)).encode(), 0o755)
    cpio.file("udhcpc.sh", UDHCPC.encode(), 0o755)
    cpio.file("etc/acpi/PWRF/00000080", POWER_BUTTON.encode(), 0o755)
    cpio.file("marker", MARKER.ljust(512, b"\0"))
    for path, (data, mode) in (files or {}).items():
        cpio.file(path.lstrip("/"), data, mode)
    names = []
    for rel in order:
        name = Path(rel).name
        cpio.file(f"modules/{name}", (kernel.modules / rel).read_bytes())
        names.append(name)
    cpio.file("modules.order", ("\n".join(names) + "\n").encode())
    dest.write_bytes(cpio.bytes())
    return names


@dataclass
class Libvirtd:
    """A libvirtd with its own config, sockets, pid file and log under `root`."""

    root: Path
    pid: int | None = None
    virtlogd_pid: int | None = None

    @property
    def uri(self) -> str:
        return f"qemu:///system?socket={self.root}/run/libvirt-sock"

    def start(self) -> None:
        (self.root / "run").mkdir(parents=True, exist_ok=True)
        conf = self.root / "libvirtd.conf"
        conf.write_text(
            f'unix_sock_dir = "{self.root}/run"\n'
            'auth_unix_rw = "none"\nauth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{self.root}/libvirtd.log"\n'
        )
        # qemu's console and stdio go through virtlogd; its socket path is fixed,
        # so reuse a running one and only start (and later stop) our own if none.
        if not Path("/run/libvirt/virtlogd-sock").exists():
            vpid = self.root / "virtlogd.pid"
            subprocess.run(["virtlogd", "-d", "-p", str(vpid)], check=True, timeout=30)
            self.virtlogd_pid = _wait_pid(vpid)
        pid_file = self.root / "libvirtd.pid"
        subprocess.run(
            ["libvirtd", "-d", "--config", str(conf), "--pid-file", str(pid_file)],
            check=True,
            timeout=60,
        )
        sock = self.root / "run" / "libvirt-sock"
        try:
            self.pid = _wait_pid(pid_file)
            deadline = time.monotonic() + 30
            while not sock.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"libvirtd did not create {sock}")
                time.sleep(0.1)
        except TimeoutError as e:
            log = self.root / "libvirtd.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise TimeoutError(f"{e}; libvirtd log:\n{tail}") from e

    def stop(self) -> None:
        for pid in (self.pid, self.virtlogd_pid):
            if pid is not None:
                _terminate(pid)
        self.pid = self.virtlogd_pid = None


def _wait_pid(pid_file: Path) -> int:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(pid_file.read_text().strip())
        if time.monotonic() > deadline:
            raise TimeoutError(f"no pid in {pid_file}")
        time.sleep(0.05)


def _terminate(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM a daemon we started, SIGKILL it if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def loop_device(backing: Path) -> Iterator[str]:
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(backing)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False, capture_output=True)
