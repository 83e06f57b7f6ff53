"""Host bootstrap (seed 003 section 2): what a deployed host needs before it can serve slices.

Pure: each check is a small function over `Facts` (read by the host-root
driver, `drivers/hostroot.py`) that returns what it found and the changes
that would fix it. `plan` runs them all, merges the package installs into
one change placed first, and decides the host's bootstrap state. Nothing
here reads a file or runs a program, so `--check` prints exactly the changes
`--apply` will make, and tests drive every rule with a table of facts.

Rules kept from the seed and the issue:

- idempotent: a host already prepared yields no change;
- a change is a value (`Change`): a managed file written whole, a mode bit,
  a stale reservation removed, or one of a closed set of commands whose argv
  the driver builds from literals (no shell);
- a kernel argument change (IOMMU, hugepages) is staged in our own GRUB
  drop-in, never in `/etc/default/grub`; it needs a reboot, which is
  reported (`reboot_required`) and never done;
- a file is written only when it is absent, already holds what we want, or
  still holds exactly what the last bootstrap wrote (its sha256 is kept in
  the bootstrap state); anything else is somebody's edit: reported
  (`host.bootstrap.file_changed`), not overwritten.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from host_reconciler import codes as host_codes

VERSION = 1  # of the bootstrap rules; recorded in the state file

MANAGED_HEADER = "# Managed by `gpuaas host bootstrap` (seed 003 section 2); local edits are reported, not lost.\n"
GRUB_DROPIN = "/etc/default/grub.d/90-gpuaas.cfg"
MODULES_FILE = "/etc/modules-load.d/gpuaas-vfio.conf"
SYSCTL_FILE = "/etc/sysctl.d/90-gpuaas.conf"
VFIO_MODULES = ("vfio", "vfio_iommu_type1", "vfio_pci")
# Host services that open the GPUs and so hold passthrough devices (seed 003: "stop host NVIDIA services").
NVIDIA_SERVICES = ("nvidia-persistenced.service", "nvidia-fabricmanager.service", "nvidia-dcgm.service", "dcgm.service")
# Baseline: the private-NAT management network forwards. Tuning only after benchmark approval (opt-in).
SYSCTL_BASELINE = (("net.ipv4.ip_forward", "1"),)
SYSCTL_TUNING = (
    ("net.core.rmem_max", "268435456"),
    ("net.core.wmem_max", "268435456"),
    ("net.core.netdev_max_backlog", "250000"),
    ("vm.swappiness", "1"),
)
# Program -> the Debian package that brings it (install is one `apt-get install` of the missing ones).
TOOLS: tuple[tuple[str, str], ...] = (
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("qemu-img", "qemu-utils"),
    ("virsh", "libvirt-clients"),
    ("libvirtd", "libvirt-daemon-system"),
    ("genisoimage", "genisoimage"),
    ("cloud-init", "cloud-init"),
    ("ovs-vsctl", "openvswitch-switch"),
    ("ovs-vswitchd", "openvswitch-switch"),
    ("dnsmasq", "dnsmasq-base"),
)
OVMF_PACKAGE = "ovmf"
RESERVATION_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")  # a VM name as the DHCP driver writes it


class ChangeKind(enum.StrEnum):
    INSTALL = "install"  # apt-get install the packages in `operands`
    WRITE_FILE = "write_file"  # `target` gets `content` whole (written aside, renamed)
    CHMOD = "chmod"  # `target` gets mode `mode`
    REMOVE_FILE = "remove_file"  # `target` (a stale reservation) is removed
    LOAD_MODULES = "load_modules"  # modprobe -a the modules in `operands`
    DISABLE_SERVICE = "disable_service"  # systemctl disable --now the unit in `operands`
    UPDATE_GRUB = "update_grub"  # regenerate grub.cfg from /etc/default/grub and its drop-ins
    RELOAD_SYSCTL = "reload_sysctl"  # sysctl --system


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    target: str = ""
    operands: tuple[str, ...] = ()
    content: str | None = None
    mode: int | None = None

    def describe(self) -> str:
        """The change as an operator reads it; for a command, the argv the driver will run."""
        commands = {
            ChangeKind.INSTALL: "apt-get install -y --no-install-recommends --",
            ChangeKind.LOAD_MODULES: "modprobe -a --",
            ChangeKind.DISABLE_SERVICE: "systemctl disable --now --",
            ChangeKind.UPDATE_GRUB: "update-grub",
            ChangeKind.RELOAD_SYSCTL: "sysctl --system",
        }
        if self.kind in commands:
            return " ".join(("run:", commands[self.kind], *self.operands))
        if self.kind is ChangeKind.WRITE_FILE:
            return f"write {self.target} ({len(self.content or '')} bytes, sha256 {digest(self.content or '')[:12]})"
        if self.kind is ChangeKind.CHMOD:
            return f"chmod {self.mode or 0:o} {self.target}"
        return f"remove {self.target}"

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": str(self.kind), "describe": self.describe()}
        if self.target:
            doc["target"] = self.target
        if self.operands:
            doc["operands"] = list(self.operands)
        if self.content is not None:
            doc["content"] = self.content
        if self.mode is not None:
            doc["mode"] = f"{self.mode:o}"
        return doc


class Outcome(enum.StrEnum):
    OK = "ok"
    CHANGE = "change"  # bootstrap will fix it (the changes say how)
    REBOOT = "reboot"  # staged; needs a reboot to take effect
    BLOCKED = "blocked"  # bootstrap cannot fix it: an operator must (the code says why)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    outcome: Outcome
    detail: str
    changes: tuple[Change, ...] = ()
    code: str | None = None  # stable code of a BLOCKED (or REBOOT) outcome
    reboot_after: bool = False  # the changes take effect only after a reboot

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": str(self.outcome),
            "detail": self.detail,
            "code": self.code,
            "reboot_after": self.reboot_after,
            "changes": [c.as_dict() for c in self.changes],
        }


@dataclass(frozen=True, slots=True)
class ServiceState:
    enabled: bool
    active: bool | None  # None: cannot tell (no systemd running, or another root)


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Facts:
    """What the driver read from the host root; every field is a plain value."""

    cmdline: tuple[str, ...] = ()
    cpu_vendor: str | None = None  # "GenuineIntel", "AuthenticAMD"
    kvm: bool = False  # /dev/kvm
    tools: Mapping[str, bool] = field(default_factory=_empty)  # program -> found on the root's PATH dirs
    ovmf: bool = False
    grub_default: str | None = None  # /etc/default/grub (None: absent)
    files: Mapping[str, str | None] = field(default_factory=_empty)  # managed path -> content (None: absent)
    written: Mapping[str, str] = field(default_factory=_empty)  # managed path -> sha256 the last bootstrap wrote
    modules: frozenset[str] = frozenset()  # /proc/modules
    sysctl: Mapping[str, str | None] = field(default_factory=_empty)  # key -> /proc/sys value
    hugepages_1g: int | None = None  # nr_hugepages of the 1 GiB pool (None: no such pool)
    services: Mapping[str, ServiceState] = field(default_factory=_empty)  # only units that exist
    dir_modes: Mapping[str, int | None] = field(default_factory=_empty)  # path -> st_mode & 0o7777 (None: absent)
    reservations: tuple[str, ...] = ()  # file names in the GPUaaS dnsmasq hosts dir
    domains: frozenset[str] | None = None  # defined libvirt domains (None: libvirt not reachable)
    reboot_flag: bool = False  # /run/reboot-required (the distribution asks for a reboot)


@dataclass(frozen=True, slots=True)
class Options:
    hugepages_1g: int = 0  # 1 GiB pages the slice runtime profile needs (0: none)
    sysctl_tuning: bool = False  # the network tuning set, after benchmark approval
    traverse: tuple[str, ...] = ("/var/lib/gpuaas", "/var/lib/gpuaas/host", "/var/lib/gpuaas/images")
    hosts_dir: str = "/var/lib/gpuaas/host/dnsmasq/hosts"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write(facts: Facts, path: str, content: str) -> tuple[Change | None, str | None]:
    """The write of a managed file, or why it is refused (a local edit); (None, None) when current."""
    current = facts.files.get(path)
    if current == content:
        return None, None
    if current is not None and facts.written.get(path) != digest(current):
        return None, f"{path} was changed since bootstrap wrote it (or was not written by it); not overwriting"
    return Change(ChangeKind.WRITE_FILE, path, content=content), None


def _managed(body: Sequence[str]) -> str:
    return MANAGED_HEADER + "".join(f"{line}\n" for line in body)


# ------------------------------------------------------------------------------------ checks


def check_virtualization(facts: Facts, opts: Options) -> Check:
    missing = sorted(
        {pkg for tool, pkg in TOOLS if not facts.tools.get(tool)} | (set() if facts.ovmf else {OVMF_PACKAGE})
    )
    if not facts.kvm:
        return Check(
            "virtualization",
            Outcome.BLOCKED,
            "/dev/kvm is missing: CPU virtualization is off in the firmware (ProcVirtualization) or kvm is not loaded",
            code=host_codes.BOOTSTRAP_KVM_MISSING,
        )
    if missing:
        return Check(
            "virtualization",
            Outcome.CHANGE,
            f"missing packages: {', '.join(missing)}",
            (Change(ChangeKind.INSTALL, operands=tuple(missing)),),
        )
    return Check("virtualization", Outcome.OK, "KVM, libvirt, QEMU, OVMF, OVS, dnsmasq and cloud-init tooling present")


def kernel_args(facts: Facts, opts: Options) -> tuple[str, ...]:
    iommu = "amd_iommu=on" if facts.cpu_vendor == "AuthenticAMD" else "intel_iommu=on"
    args = [iommu, "iommu=pt"]
    if opts.hugepages_1g:
        args += ["default_hugepagesz=1G", "hugepagesz=1G", f"hugepages={opts.hugepages_1g}"]
    return tuple(args)


_CONFLICTS = {"intel_iommu=on": "intel_iommu=off", "amd_iommu=on": "amd_iommu=off", "iommu=pt": "iommu=off"}


def _grub_values(text: str) -> list[str]:
    """The words GRUB_CMDLINE_LINUX(_DEFAULT) assigns in a grub defaults file (shell quoting, simply)."""
    out: list[str] = []
    for m in re.finditer(r'^\s*GRUB_CMDLINE_LINUX(?:_DEFAULT)?=(["\']?)(.*?)\1\s*$', text, re.M):
        out.extend(w for w in m.group(2).split() if not w.startswith("$"))
    return out


def check_kernel_args(facts: Facts, opts: Options) -> Check:
    want = kernel_args(facts, opts)
    missing = [a for a in want if a not in facts.cmdline]
    if not missing:
        return Check("kernel_args", Outcome.OK, "running kernel has " + " ".join(want))
    if facts.grub_default is None:
        return Check(
            "kernel_args",
            Outcome.BLOCKED,
            f"kernel lacks {' '.join(missing)} and /etc/default/grub is "
            "missing: stage the arguments in this host's boot loader by hand",
            code=host_codes.BOOTSTRAP_GRUB_MISSING,
        )
    staged_words = _grub_values(facts.grub_default)
    conflicts = [w for a in missing if (w := _CONFLICTS.get(a, "")) and w in staged_words]
    if conflicts:
        return Check(
            "kernel_args",
            Outcome.BLOCKED,
            f"/etc/default/grub sets {' '.join(conflicts)}; bootstrap never edits that file: remove it by hand",
            code=host_codes.BOOTSTRAP_GRUB_CONFLICT,
        )
    content = _managed([f'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX {" ".join(want)}"'])
    change, refused = _write(facts, GRUB_DROPIN, content)
    if all(a in staged_words for a in missing):
        change = None  # staged in /etc/default/grub itself (by hand): nothing to write, only a reboot
    elif refused:
        return Check("kernel_args", Outcome.BLOCKED, refused, code=host_codes.BOOTSTRAP_FILE_CHANGED)
    if change is None:
        return Check(
            "kernel_args",
            Outcome.REBOOT,
            f"{' '.join(missing)} staged; the running kernel lacks them",
            code=host_codes.BOOTSTRAP_REBOOT_REQUIRED,
            reboot_after=True,
        )
    changes = tuple(c for c in (change, Change(ChangeKind.UPDATE_GRUB)) if c is not None)
    return Check(
        "kernel_args",
        Outcome.CHANGE,
        f"kernel lacks {' '.join(missing)}: stage them in {GRUB_DROPIN}",
        changes,
        reboot_after=True,
    )


def check_vfio_modules(facts: Facts, opts: Options) -> Check:
    change, refused = _write(facts, MODULES_FILE, _managed(VFIO_MODULES))
    if refused:
        return Check("vfio_modules", Outcome.BLOCKED, refused, code=host_codes.BOOTSTRAP_FILE_CHANGED)
    unloaded = tuple(m for m in VFIO_MODULES if m not in facts.modules)
    changes = tuple(
        c for c in (change, Change(ChangeKind.LOAD_MODULES, operands=unloaded) if unloaded else None) if c is not None
    )
    if not changes:
        return Check("vfio_modules", Outcome.OK, "vfio modules loaded and loaded at boot")
    why = [f"write {MODULES_FILE}"] if change else []
    why += [f"load {', '.join(unloaded)}"] if unloaded else []
    return Check("vfio_modules", Outcome.CHANGE, "; ".join(why), changes)


def check_hugepages(facts: Facts, opts: Options) -> Check:
    if not opts.hugepages_1g:
        return Check("hugepages", Outcome.OK, "no 1 GiB hugepages requested")
    have = facts.hugepages_1g or 0
    if have >= opts.hugepages_1g:
        return Check("hugepages", Outcome.OK, f"{have} x 1 GiB hugepages reserved")
    return Check(
        "hugepages",
        Outcome.REBOOT,
        f"{have} of {opts.hugepages_1g} x 1 GiB hugepages reserved; the kernel arguments reserve them at the next boot",
        code=host_codes.BOOTSTRAP_REBOOT_REQUIRED,
        reboot_after=True,
    )


def check_sysctl(facts: Facts, opts: Options) -> Check:
    wanted = SYSCTL_BASELINE + (SYSCTL_TUNING if opts.sysctl_tuning else ())
    change, refused = _write(facts, SYSCTL_FILE, _managed([f"{k} = {v}" for k, v in wanted]))
    if refused:
        return Check("sysctl", Outcome.BLOCKED, refused, code=host_codes.BOOTSTRAP_FILE_CHANGED)
    off = [k for k, v in wanted if facts.sysctl.get(k) != v]
    changes = tuple(c for c in (change, Change(ChangeKind.RELOAD_SYSCTL) if off or change else None) if c is not None)
    if not changes:
        return Check("sysctl", Outcome.OK, ", ".join(f"{k}={v}" for k, v in wanted))
    return Check("sysctl", Outcome.CHANGE, f"differs: {', '.join(off) or 'file only'}", changes)


def check_nvidia_services(facts: Facts, opts: Options) -> Check:
    holding = [u for u in NVIDIA_SERVICES if (s := facts.services.get(u)) is not None and (s.enabled or s.active)]
    if not holding:
        return Check("nvidia_services", Outcome.OK, "no host NVIDIA service enabled or running")
    return Check(
        "nvidia_services",
        Outcome.CHANGE,
        f"would hold passthrough GPUs: {', '.join(holding)}",
        tuple(Change(ChangeKind.DISABLE_SERVICE, operands=(u,)) for u in holding),
    )


def check_libvirt_permissions(facts: Facts, opts: Options) -> Check:
    """QEMU runs as libvirt-qemu: each directory above its disks, seeds and images needs the search bit."""
    changes = tuple(
        Change(ChangeKind.CHMOD, d, mode=mode | 0o001)
        for d in opts.traverse
        if (mode := facts.dir_modes.get(d)) is not None and not mode & 0o001
    )
    if not changes:
        return Check("libvirt_permissions", Outcome.OK, "state and image directories are traversable by QEMU")
    return Check(
        "libvirt_permissions",
        Outcome.CHANGE,
        "not traversable by QEMU: " + ", ".join(c.target for c in changes),
        changes,
    )


def check_dnsmasq(facts: Facts, opts: Options) -> Check:
    if facts.domains is None:
        return Check("dnsmasq_cleanup", Outcome.OK, "libvirt not reachable: stale reservations not judged")
    stale = sorted(n for n in facts.reservations if RESERVATION_NAME.match(n) and n not in facts.domains)
    if not stale:
        return Check("dnsmasq_cleanup", Outcome.OK, "no stale GPUaaS DHCP reservation")
    return Check(
        "dnsmasq_cleanup",
        Outcome.CHANGE,
        f"reservations of undefined VMs: {', '.join(stale)}",
        tuple(Change(ChangeKind.REMOVE_FILE, f"{opts.hosts_dir}/{n}") for n in stale),
    )


CHECKS = (
    check_virtualization,
    check_kernel_args,
    check_vfio_modules,
    check_hugepages,
    check_sysctl,
    check_nvidia_services,
    check_libvirt_permissions,
    check_dnsmasq,
)


class State(enum.StrEnum):
    READY = "ready"
    CHANGES_PENDING = "changes_pending"
    REBOOT_REQUIRED = "reboot_required"
    BLOCKED = "blocked"
    FAILED = "failed"  # an --apply step failed (the state file keeps the error)


@dataclass(frozen=True, slots=True)
class Plan:
    checks: tuple[Check, ...]
    changes: tuple[Change, ...]  # in the order --apply runs them
    state: State
    reboot_required: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "state": str(self.state),
            "reboot_required": self.reboot_required,
            "checks": [c.as_dict() for c in self.checks],
            "changes": [c.describe() for c in self.changes],
        }


def plan(facts: Facts, opts: Options) -> Plan:
    checks = tuple(fn(facts, opts) for fn in CHECKS)
    installs = sorted({p for c in checks for ch in c.changes if ch.kind is ChangeKind.INSTALL for p in ch.operands})
    rest = [ch for c in checks for ch in c.changes if ch.kind is not ChangeKind.INSTALL]
    changes = ((Change(ChangeKind.INSTALL, operands=tuple(installs)),) if installs else ()) + tuple(rest)
    reboot = facts.reboot_flag or any(c.outcome is Outcome.REBOOT or (c.reboot_after and c.changes) for c in checks)
    if any(c.outcome is Outcome.BLOCKED for c in checks):
        state = State.BLOCKED
    elif changes:
        state = State.CHANGES_PENDING
    elif reboot:
        state = State.REBOOT_REQUIRED
    else:
        state = State.READY
    return Plan(checks, changes, state, reboot)
