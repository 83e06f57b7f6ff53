"""Host-wide facts: NUMA nodes and their CPUs, hugepages, and slice prerequisites.

Prerequisites are the bootstrap checks seed 003 names (IOMMU, KVM, VFIO,
libvirt, OVS, reboot required), read from the same root as sysfs: a recorded
tree carries `dev/kvm`, `usr/sbin/libvirtd` and friends as plain files. A
reboot is required when the root says so (`run/reboot-required`) or when
kernel arguments this product needs are staged in `etc/default/grub` but not
yet in `proc/cmdline`.
"""

from __future__ import annotations

import re

from host_reconciler.discovery import facts
from host_reconciler.discovery.sysfs import SysRoot

IOMMU = "iommu"
KVM = "kvm"
VFIO_PCI = "vfio_pci"
LIBVIRT = "libvirt"
OVS = "ovs"
REBOOT = "reboot"
HUGEPAGES = "hugepages"

LIBVIRT_BINARIES = ("usr/sbin/libvirtd", "usr/sbin/virtqemud", "usr/bin/virsh")
LIBVIRT_SOCKETS = ("run/libvirt/libvirt-sock", "run/libvirt/virtqemud-sock")
OVS_BINARIES = ("usr/sbin/ovs-vswitchd", "usr/bin/ovs-vsctl")
OVS_SOCKETS = ("run/openvswitch/db.sock",)
REBOOT_FLAGS = ("run/reboot-required", "var/run/reboot-required")
# Kernel arguments whose staging in grub means nothing changes until a reboot.
WATCHED_ARGS = frozenset(
    {
        "intel_iommu",
        "amd_iommu",
        "iommu",
        "default_hugepagesz",
        "hugepagesz",
        "hugepages",
        "vfio-pci.ids",
        "vfio_pci.ids",
    }
)

_NODE = re.compile(r"^node(\d+)$")
_HUGEPAGES = re.compile(r"^hugepages-(\d+)kB$")
_GRUB_LINE = re.compile(r"^\s*GRUB_CMDLINE_LINUX(?:_DEFAULT)?=(.*)$", re.MULTILINE)


def parse_cpulist(text: str | None) -> tuple[int, ...]:
    """ "0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11); junk reads as empty."""
    out: list[int] = []
    for raw in (text or "").split(","):
        part = raw.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return ()
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def read_hugepages(sr: SysRoot, rel: str) -> tuple[facts.Hugepages, ...]:
    out = []
    for name in sr.listdir(rel):
        match = _HUGEPAGES.match(name)
        if match is None:
            continue
        out.append(
            facts.Hugepages(
                size_kib=int(match.group(1)),
                total=sr.read_int(f"{rel}/{name}/nr_hugepages") or 0,
                free=sr.read_int(f"{rel}/{name}/free_hugepages") or 0,
            )
        )
    return tuple(sorted(out, key=lambda h: h.size_kib))


def numa_nodes(sr: SysRoot) -> tuple[facts.NumaNode, ...]:
    base = "sys/devices/system/node"
    out = []
    for name in sr.listdir(base):
        match = _NODE.match(name)
        if match is None:
            continue
        cpulist = sr.read(f"{base}/{name}/cpulist") or ""
        out.append(
            facts.NumaNode(
                node=int(match.group(1)),
                cpus=parse_cpulist(cpulist),
                cpulist=cpulist,
                memory_kib=_mem_total(sr.read(f"{base}/{name}/meminfo")),
                hugepages=read_hugepages(sr, f"{base}/{name}/hugepages"),
            )
        )
    if not out:
        # A kernel without NUMA support still has CPUs: call them node 0.
        cpulist = sr.read("sys/devices/system/cpu/online") or ""
        out.append(facts.NumaNode(0, parse_cpulist(cpulist), cpulist, None, ()))
    return tuple(sorted(out, key=lambda n: n.node))


def _mem_total(meminfo: str | None) -> int | None:
    match = re.search(r"MemTotal:\s+(\d+)\s*kB", meminfo or "")
    return int(match.group(1)) if match else None


def _first(sr: SysRoot, paths: tuple[str, ...]) -> str | None:
    return next((p for p in paths if sr.exists(p)), None)


def _installed(
    sr: SysRoot, name: str, what: str, binaries: tuple[str, ...], sockets: tuple[str, ...]
) -> facts.Prerequisite:
    binary = _first(sr, binaries)
    if binary is None:
        return facts.Prerequisite(name, False, f"{what} not installed (none of /{', /'.join(binaries)})")
    running = "running" if _first(sr, sockets) else "not running (no control socket)"
    return facts.Prerequisite(name, True, f"installed (/{binary}), {running}")


def staged_kernel_args(sr: SysRoot, cmdline: str) -> tuple[str, ...]:
    """Watched arguments set in grub config but absent from the running kernel's cmdline."""
    texts = [sr.read("etc/default/grub") or ""]
    texts += [sr.read(f"etc/default/grub.d/{n}") or "" for n in sr.listdir("etc/default/grub.d") if n.endswith(".cfg")]
    running = set(cmdline.split())
    staged: list[str] = []
    for text in texts:
        for value in _GRUB_LINE.findall(text):
            for token in value.strip().strip("'\"").split():
                key = token.split("=", 1)[0]
                if key in WATCHED_ARGS and token not in running and token not in staged:
                    staged.append(token)
    return tuple(staged)


def _iommu(sr: SysRoot, cmdline: str) -> facts.Prerequisite:
    groups = sum(1 for g in sr.listdir("sys/kernel/iommu_groups") if g.isdigit())
    flags = " ".join(t for t in cmdline.split() if t.split("=", 1)[0] in {"intel_iommu", "amd_iommu", "iommu"})
    if groups:
        return facts.Prerequisite(IOMMU, True, f"{groups} IOMMU groups" + (f" ({flags})" if flags else ""))
    hint = "enable VT-d/AMD-Vi in firmware and intel_iommu=on or amd_iommu=on"
    return facts.Prerequisite(IOMMU, False, f"no IOMMU groups: {hint}" + (f" (cmdline has {flags})" if flags else ""))


def _vfio(sr: SysRoot, kernel: str | None) -> facts.Prerequisite:
    if sr.is_dir("sys/bus/pci/drivers/vfio-pci") or sr.is_dir("sys/module/vfio_pci"):
        return facts.Prerequisite(VFIO_PCI, True, "vfio-pci driver loaded")
    files = ("modules.dep", "modules.builtin") if kernel else ()
    if any("vfio-pci.ko" in (sr.read(f"lib/modules/{kernel}/{f}") or "") for f in files):
        return facts.Prerequisite(VFIO_PCI, False, "vfio-pci available but not loaded (modprobe vfio-pci)")
    return facts.Prerequisite(VFIO_PCI, False, "vfio-pci driver not loaded")


def _reboot(sr: SysRoot, cmdline: str) -> facts.Prerequisite:
    flag = _first(sr, REBOOT_FLAGS)
    if flag is not None:
        return facts.Prerequisite(REBOOT, False, f"reboot required (/{flag})")
    staged = staged_kernel_args(sr, cmdline)
    if staged:
        return facts.Prerequisite(REBOOT, False, f"reboot required: staged kernel args not active: {' '.join(staged)}")
    return facts.Prerequisite(REBOOT, True, "no reboot pending")


def prerequisites(
    sr: SysRoot, *, kernel: str | None, cmdline: str, hugepages: tuple[facts.Hugepages, ...]
) -> tuple[facts.Prerequisite, ...]:
    """Seed 003's bootstrap checks, in a fixed order; hugepages are reported, not required."""
    kvm = sr.exists("dev/kvm")
    pages = ", ".join(f"{page_size(h.size_kib)}: {h.total} total, {h.free} free" for h in hugepages if h.total)
    return (
        _iommu(sr, cmdline),
        facts.Prerequisite(KVM, kvm, "/dev/kvm present" if kvm else "/dev/kvm missing"),
        _vfio(sr, kernel),
        _installed(sr, LIBVIRT, "libvirt", LIBVIRT_BINARIES, LIBVIRT_SOCKETS),
        _installed(sr, OVS, "openvswitch", OVS_BINARIES, OVS_SOCKETS),
        _reboot(sr, cmdline),
        facts.Prerequisite(
            HUGEPAGES,
            bool(pages),
            pages or "none reserved (needed only by hugepage-backed VM profiles)",
            required=False,
        ),
    )


def page_size(kib: int) -> str:
    """2048 -> "2M", 1048576 -> "1G"."""
    return f"{kib // (1024 * 1024)}G" if kib >= 1024 * 1024 else f"{kib // 1024}M"
