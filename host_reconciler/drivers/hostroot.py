"""The host-root driver of `gpuaas host bootstrap`: read the facts, make one change.

Everything is read under `root` (`/` on a host; a throwaway directory in
tests): /proc/cmdline, /proc/cpuinfo, /proc/modules, /proc/sys, the 1 GiB
hugepage pool, /dev/kvm, the programs on the usual PATH directories, OVMF,
/etc/default/grub and the files bootstrap manages, systemd unit links, the
modes of the directories QEMU must traverse, the GPUaaS DHCP reservation
files. Files are written whole (aside, fsynced, renamed) under `root`.

Commands run only on the live root (`/`): under another root they are
returned as `deferred` (a throwaway root cannot load modules or install
packages). Each command's argv is built here from literals, values after a
literal "--" (no shell). A command exiting non-zero fails the change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from host_reconciler import bootstrapping as b
from host_reconciler import codes as host_codes
from host_reconciler.drivers import tools
from schemas.errors import GpuaasError, PermanentError

Runner = Callable[[Sequence[str]], tools.ToolResult]
_PATH = ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin", "usr/lib/qemu")
_OVMF = (
    "usr/share/OVMF/OVMF_CODE.fd",
    "usr/share/OVMF/OVMF_CODE_4M.fd",
    "usr/share/ovmf/OVMF.fd",
    "usr/share/qemu/OVMF.fd",
)
_UNIT_DIRS = ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")
_MANAGED = (b.GRUB_DROPIN, b.MODULES_FILE, b.SYSCTL_FILE)
_SYSCTLS = tuple(k for k, _ in b.SYSCTL_BASELINE + b.SYSCTL_TUNING)


def _run(argv: Sequence[str]) -> tools.ToolResult:
    return tools.run(argv, timeout=1800.0)  # only ever given an argv built in HostRoot (literals, then "--")


READ_TIMEOUT_S = 30.0  # a query (systemctl is-active, virsh list) must not hold --check for long


class HostRoot:
    def __init__(
        self,
        root: Path = Path("/"),
        *,
        runner: Runner | None = None,
        domains: Callable[[], frozenset[str] | None] | None = None,
        written: dict[str, str] | None = None,
    ) -> None:
        self.root = root
        self.live = root.resolve() == Path("/")
        self.runner: Runner = runner or _run
        self._domains = domains
        self.written = dict(written or {})  # managed path -> sha256 the last bootstrap wrote

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def _text(self, absolute: str) -> str | None:
        try:
            return self.path(absolute).read_text(errors="replace")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    # -- facts -----------------------------------------------------------------------------
    def facts(self, opts: b.Options) -> b.Facts:
        cpuinfo = self._text("/proc/cpuinfo") or ""
        vendor = next(
            (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("vendor_id")), None
        )
        modules = frozenset(line.split()[0] for line in (self._text("/proc/modules") or "").splitlines() if line)
        huge = self._text("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages")
        return b.Facts(
            cmdline=tuple((self._text("/proc/cmdline") or "").split()),
            cpu_vendor=vendor,
            kvm=self.path("/dev/kvm").exists(),
            tools={t: any(self.path(f"/{d}/{t}").exists() for d in _PATH) for t, _ in b.TOOLS},
            ovmf=any(self.path(f"/{p}").exists() for p in _OVMF),
            grub_default=self._text("/etc/default/grub"),
            files={p: self._text(p) for p in _MANAGED},
            written=dict(self.written),
            modules=modules,
            sysctl={
                k: (v.strip() if (v := self._text("/proc/sys/" + k.replace(".", "/"))) is not None else None)
                for k in _SYSCTLS
            },
            hugepages_1g=int(huge) if huge and huge.strip().isdigit() else None,
            services={u: s for u in b.NVIDIA_SERVICES if (s := self._service(u)) is not None},
            dir_modes={d: self._mode(d) for d in opts.traverse},
            reservations=self._reservations(opts.hosts_dir),
            domains=self._domains() if self._domains is not None else self._virsh_domains(),
            reboot_flag=self.path("/run/reboot-required").exists(),
        )

    def _service(self, unit: str) -> b.ServiceState | None:
        if not any(self.path(f"/{d}/{unit}").exists() for d in _UNIT_DIRS):
            return None
        wants = self.path("/etc/systemd/system")
        enabled = wants.is_dir() and any(w.is_dir() and (w / unit).is_symlink() for w in wants.glob("*.wants"))
        active: bool | None = None
        if self.live and Path("/run/systemd/system").is_dir():
            try:
                active = (
                    tools.run(["systemctl", "is-active", "--quiet", "--", unit], timeout=READ_TIMEOUT_S).returncode == 0
                )
            except GpuaasError:
                active = None  # cannot tell: reported as unknown, the unit link still decides
        return b.ServiceState(enabled=enabled, active=active)

    def _mode(self, absolute: str) -> int | None:
        try:
            return self.path(absolute).stat().st_mode & 0o7777
        except FileNotFoundError:
            return None

    def _reservations(self, hosts_dir: str) -> tuple[str, ...]:
        d = self.path(hosts_dir)
        return tuple(sorted(p.name for p in d.iterdir() if p.is_file())) if d.is_dir() else ()

    def _virsh_domains(self) -> frozenset[str] | None:
        if not self.live:
            return None
        try:
            res = tools.run(["virsh", "--connect", "qemu:///system", "list", "--all", "--name"], timeout=READ_TIMEOUT_S)
        except GpuaasError:
            return None  # virsh not installed yet, or libvirt hangs: nothing to judge reservations by
        if res.returncode != 0:
            return None
        return frozenset(n.strip() for n in res.stdout.splitlines() if n.strip())

    # -- changes ---------------------------------------------------------------------------
    def apply(self, change: b.Change, opts: b.Options) -> dict[str, Any]:
        """Make one change; returns its evidence. Raises PermanentError when it fails."""
        k = change.kind
        if k is b.ChangeKind.WRITE_FILE:
            if change.target not in _MANAGED:
                raise PermanentError(
                    f"{change.target} is not a file bootstrap manages", code=host_codes.BOOTSTRAP_REFUSED
                )
            self._write(change.target, change.content or "")
            return {"written": change.target, "sha256": b.digest(change.content or "")}
        if k is b.ChangeKind.CHMOD:
            if change.target not in opts.traverse or change.mode is None:
                raise PermanentError(
                    f"{change.target} is not a directory bootstrap may chmod", code=host_codes.BOOTSTRAP_REFUSED
                )
            os.chmod(self.path(change.target), change.mode)
            return {"chmod": change.target, "mode": f"{change.mode:o}"}
        if k is b.ChangeKind.REMOVE_FILE:
            target = Path(change.target)
            if str(target.parent) != opts.hosts_dir or not b.RESERVATION_NAME.match(target.name):
                raise PermanentError(f"{change.target} is not a GPUaaS reservation", code=host_codes.BOOTSTRAP_REFUSED)
            self.path(change.target).unlink(missing_ok=True)
            return {"removed": change.target}
        argv = self._argv(change)
        if not self.live:
            return {"deferred": argv, "why": f"root {self.root} is not the live root"}
        res = self.runner(argv)
        if res.returncode != 0:
            raise PermanentError(
                f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()[-500:]}",
                code=host_codes.BOOTSTRAP_COMMAND_FAILED,
            )
        return {"ran": argv}

    @staticmethod
    def _argv(change: b.Change) -> list[str]:
        k, ops = change.kind, [tools.operand(o) for o in change.operands]
        if k is b.ChangeKind.INSTALL:
            return ["apt-get", "install", "-y", "--no-install-recommends", "--", *ops]
        if k is b.ChangeKind.LOAD_MODULES:
            return ["modprobe", "-a", "--", *ops]
        if k is b.ChangeKind.DISABLE_SERVICE:
            return ["systemctl", "disable", "--now", "--", *ops]
        if k is b.ChangeKind.UPDATE_GRUB:
            return ["update-grub"]
        if k is b.ChangeKind.RELOAD_SYSCTL:
            return ["sysctl", "--system"]
        raise PermanentError(f"unknown bootstrap change {k}", code=host_codes.BOOTSTRAP_REFUSED)

    def _write(self, absolute: str, content: str) -> None:
        target = self.path(absolute)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.gpuaas-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, content.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        self.written[absolute] = b.digest(content)
