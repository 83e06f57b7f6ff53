"""Host settings: what one node's host reconciler needs that is not in its plan.

Read from a JSON file (`gpuaas host ... --config FILE`, or
$GPUAAS_HOST_CONFIG), every key optional; the defaults are a production
host's. docs/host-reconciler.md ("Host settings") has the table of every key
with its type, default and meaning; tests/host/test_settings_docs.py keeps
that table, and this example, in step with the fields below. Tests and the
demo point the same settings at a libvirt test driver, a temp state dir, a
temp by-id directory of symlinks to loop devices, and a network namespace.

    {
      "libvirt_uri": "qemu:///system",
      "state_dir": "/var/lib/gpuaas/host",
      "image_dir": "/var/lib/gpuaas/images",
      "by_id_root": "/dev/disk/by-id",
      "mountinfo": "/proc/self/mountinfo",  # the disk guard never writes a mounted disk
      "sysfs_root": "/sys",
      "discovery_root": "auto",        # the host root the discovery gate reads (see below); null: off
      "vfio_bind": false,              # bind GPUs/VFs to vfio-pci if needed (explicit opt-in)
      "drift_mode": "report",          # or "self-heal"
      "domain_type": null,             # kvm | qemu | test (null: from the URI)
      "firmware": "efi",
      "bridge_kind": "linux",          # or "ovs"
      "ovs_db": null,                  # OVSDB address (null: ovs-vsctl's default)
      "ovs_datapath": "netdev",        # or "system" (kernel datapath)
      "reserved_cpus_per_cell": 0,
      "direct_kernel": null,           # lab: {"kernel", "initrd", "cmdline"} booted directly
      "manage_network": true,          # ensure bridge + NAT + port isolation
      "netns": null,                   # run bridge, dnsmasq and readiness inside this netns
      "dhcp_state_dir": null,          # dnsmasq state (default <state_dir>/dnsmasq)
      "readiness_port": 22,
      "guest_marker_port": 8479,       # guests announce /var/lib/gpuaas/slice-ready to this port of the bridge
      "readiness": "lease-tcp",        # or "none" (test driver: no guest ever boots)
      "readiness_devices": true,       # readiness also needs the guest's device report to match the claim
      "pci": "sysfs",                  # or "fake-vfio" (no GPUs on this machine)
      "poll_interval_s": 10,
      "graceful_poll_s": 0.5,          # state checks while a guest shuts down
      "wipe_sample_count": 64,         # samples read back to verify a wipe
      "image_base_url": null,          # platform_storage images: <base>/<source_ref> (null: staged files only)
      "image_max_bytes": 68719476736,  # cap on one image download (64 GiB, seed 002)
      "image_cache_bytes": null,       # cache budget, LRU eviction above it (null: half its filesystem)
      "image_pins": [],                # sha256:HEX digests never evicted here (besides in-use ones)
      "allow_file_images": false,      # take file:// image URLs (labs)
      "image_fetch_timeout_s": 60,     # socket timeout of one image request
      "firmware_dir": "/var/lib/gpuaas/firmware-profile",  # the firmware helper's evidence (seed 003 section 1)
      "bootstrap_dir": "/var/lib/gpuaas/bootstrap"         # `gpuaas host bootstrap` state (seed 003 section 2)
    }

The image cache lives under `image_dir` (`sha256/<hex>`, see `imagecache`).

The discovery gate (`host_reconciler.discovery`: GPUs, VFs, NUMA nodes, slot
disks against the approved slots) runs by default wherever sysfs is there:
"auto" is the root that holds `sysfs_root` ("/" for "/sys") when the host
reads its PCI devices from sysfs (`pci: sysfs`) and `<sysfs_root>/class/block`
exists. A lab host without GPUs (`pci: fake-vfio`) has no hardware to gate,
so "auto" is off there. A path points the gate at a recorded tree
(`examples/sysfs/...`); null turns it off. The disk guard's identity check
does not depend on it: it always reads the real block device in /sys.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from host_reconciler import codes as host_codes
from host_reconciler.actions import DriftMode
from host_reconciler.domains import DirectKernel, DomainOptions, default_domain_type
from host_reconciler.drivers.protocols import DiskSettings
from host_reconciler.imagecache import DEFAULT_MAX_BYTES, CacheError, default_budget, digest_hex
from schemas.errors import PermanentError

ENV_CONFIG = "GPUAAS_HOST_CONFIG"
AUTO: Literal["auto"] = "auto"


class SettingsError(PermanentError):
    code = host_codes.SETTINGS_INVALID


@dataclass(frozen=True, slots=True)
class HostSettings:
    node: str
    libvirt_uri: str = "qemu:///system"
    state_dir: Path = Path("/var/lib/gpuaas/host")
    image_dir: Path = Path("/var/lib/gpuaas/images")
    by_id_root: Path = Path("/dev/disk/by-id")
    mountinfo: Path = Path("/proc/self/mountinfo")
    sysfs_root: Path = Path("/sys")
    discovery_root: Path | Literal["auto"] | None = AUTO  # never "auto" once built: see __post_init__
    vfio_bind: bool = False
    drift_mode: DriftMode = DriftMode.REPORT
    domain_type: str | None = None
    firmware: Literal["efi", "bios"] = "efi"
    bridge_kind: Literal["linux", "ovs"] = "linux"
    ovs_db: str | None = None  # OVSDB address (default: ovs-vsctl's)
    ovs_datapath: Literal["netdev", "system"] = "netdev"  # netdev: userspace, no kernel datapath
    reserved_cpus_per_cell: int = 0
    direct_kernel: DirectKernel | None = None
    manage_network: bool = True
    netns: str | None = None
    dhcp_state_dir: Path | None = None
    readiness_port: int = 22
    guest_marker_port: int = 8479  # guests announce /var/lib/gpuaas/slice-ready here (drivers.guestmarker)
    readiness: Literal["lease-tcp", "none"] = "lease-tcp"
    readiness_devices: bool = True  # the guest's GPUs and fabric ports must match the claim (devicereports)
    pci: Literal["sysfs", "fake-vfio"] = "sysfs"
    poll_interval_s: float = 10.0
    graceful_poll_s: float = 0.5
    wipe_sample_count: int = 64
    image_base_url: str | None = None
    image_max_bytes: int = DEFAULT_MAX_BYTES
    image_cache_bytes: int | None = None
    image_pins: tuple[str, ...] = ()
    allow_file_images: bool = False
    image_fetch_timeout_s: float = 60.0
    firmware_dir: Path = Path("/var/lib/gpuaas/firmware-profile")
    bootstrap_dir: Path = Path("/var/lib/gpuaas/bootstrap")
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.discovery_root == AUTO:
            object.__setattr__(self, "discovery_root", default_discovery_root(self.sysfs_root, self.pci))

    def domain_options(self, *, seed_iso: str | None = None) -> DomainOptions:
        return DomainOptions(
            domain_type=self.domain_type or default_domain_type(self.libvirt_uri),
            firmware=self.firmware,
            bridge_kind=self.bridge_kind,
            seed_iso=seed_iso,
            direct_kernel=self.direct_kernel,
            reserved_cpus_per_cell=self.reserved_cpus_per_cell,
        )

    def disk_settings(self) -> DiskSettings:
        return DiskSettings(
            by_id_root=self.by_id_root,
            mountinfo=self.mountinfo,
            sysfs_root=Path("/sys"),
            identity_root=self.sysfs_root,
            sample_count=self.wipe_sample_count,
        )

    @property
    def dnsmasq_dir(self) -> Path:
        return self.dhcp_state_dir or self.state_dir / "dnsmasq"

    def image_budget(self) -> int:
        if self.image_cache_bytes is not None:
            return self.image_cache_bytes
        return default_budget(self.image_dir)


def default_discovery_root(sysfs_root: Path, pci: str) -> Path | None:
    """What "auto" means (module docstring): the host root over `sysfs_root`, or None (off)."""
    if pci != "sysfs" or not (sysfs_root / "class" / "block").is_dir():
        return None
    return sysfs_root.parent


_PATHS = {
    "state_dir",
    "image_dir",
    "by_id_root",
    "mountinfo",
    "sysfs_root",
    "discovery_root",
    "dhcp_state_dir",
    "firmware_dir",
    "bootstrap_dir",
}


def from_dict(node: str, doc: dict[str, Any]) -> HostSettings:
    known = {f.name for f in fields(HostSettings)} - {"node", "extra"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise SettingsError(f"unknown host settings: {', '.join(unknown)}", code=host_codes.SETTINGS_UNKNOWN)
    values: dict[str, Any] = {}
    for k, v in doc.items():
        if k == "discovery_root" and v == AUTO:
            values[k] = AUTO
        elif k in _PATHS:
            values[k] = Path(v) if v is not None else None
        elif k == "drift_mode":
            try:
                values[k] = DriftMode(v)
            except ValueError as e:
                raise SettingsError(f"drift_mode must be report or self-heal, not {v!r}") from e
        elif k == "direct_kernel":
            values[k] = DirectKernel(**v) if v else None
        elif k == "image_pins":
            values[k] = _pins(v)
        else:
            values[k] = v
    s = HostSettings(node=node, **values)
    if s.firmware not in ("efi", "bios") or s.bridge_kind not in ("linux", "ovs"):
        raise SettingsError("firmware must be efi|bios and bridge_kind linux|ovs")
    if s.ovs_datapath not in ("netdev", "system"):
        raise SettingsError("ovs_datapath must be netdev or system")
    if s.readiness not in ("lease-tcp", "none") or s.pci not in ("sysfs", "fake-vfio"):
        raise SettingsError("readiness must be lease-tcp|none and pci sysfs|fake-vfio")
    _check_images(s)
    _check_ports(s)
    return s


def _check_ports(s: HostSettings) -> None:
    for name in ("readiness_port", "guest_marker_port"):
        port = getattr(s, name)
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise SettingsError(f"{name} must be a TCP port (1-65535), not {port!r}")


def _pins(v: object) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise SettingsError("image_pins must be a list of sha256:HEX digests")
    try:
        return tuple(digest_hex(str(d)) for d in v)
    except CacheError as e:
        raise SettingsError(f"image_pins: {e.message}") from e


def _check_images(s: HostSettings) -> None:
    for name in ("image_max_bytes", "image_cache_bytes"):
        n = getattr(s, name)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n <= 0):
            raise SettingsError(f"{name} must be a positive integer of bytes, not {n!r}")
    if s.image_base_url is not None:
        from host_reconciler import fetching

        try:
            fetching.check_url(s.image_base_url, allow_file=True)
        except PermanentError as e:
            raise SettingsError(f"image_base_url: {e.message}") from e


def load(node: str, path: Path | None = None) -> HostSettings:
    p = path or (Path(os.environ[ENV_CONFIG]) if os.environ.get(ENV_CONFIG) else None)
    if p is None:
        return HostSettings(node=node)
    from schemas import inputfiles
    from schemas.errors import PermanentError

    try:
        doc = json.loads(
            inputfiles.read_bytes(p, limit=inputfiles.MIB, code=host_codes.SETTINGS_UNREADABLE, what="host settings")
        )
    except PermanentError as e:
        raise SettingsError(e.message, code=host_codes.SETTINGS_UNREADABLE) from e
    except ValueError as e:  # json's message names a position, never the content
        raise SettingsError(f"cannot read host settings {p}: {e}", code=host_codes.SETTINGS_UNREADABLE) from e
    if not isinstance(doc, dict):
        raise SettingsError(f"{p} must hold a JSON object")
    return from_dict(node, doc)


def to_dict(s: HostSettings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(HostSettings):
        if f.name in ("node", "extra"):
            continue
        v = getattr(s, f.name)
        if isinstance(v, Path):
            v = str(v)
        elif f.name == "direct_kernel" and v is not None:
            v = {"kernel": v.kernel, "initrd": v.initrd, "cmdline": v.cmdline}
        elif f.name == "drift_mode":
            v = str(v)
        elif f.name == "image_pins":
            v = [f"sha256:{d}" for d in v]
        out[f.name] = v
    return out


def with_mode(s: HostSettings, mode: DriftMode) -> HostSettings:
    return replace(s, drift_mode=mode)
