"""libvirt driver: define, start, stop and undefine slice VMs; read them back.

`DomainDriver` is the Protocol the engine uses; `LibvirtDomains` is the real
driver over libvirt-python (`qemu:///system` on a host, `test:///default` or
`test+unix:///default?socket=...` in tests, where libvirt itself checks the
XML that `domains.build` produced).

Errors: `libvirt.libvirtError` never leaves this module. A vanished domain
is not an error for the idempotent calls (stop, undefine); a refused XML is
a `PermanentError`; everything else (daemon gone, RPC failure) is a
`TemporaryError` the host loop retries.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import libvirt

from host_reconciler import codes as host_codes
from host_reconciler import domains, pinning
from host_reconciler.observations import DomainObs, DomainState
from schemas.errors import PermanentError, TemporaryError


class LibvirtError(TemporaryError):
    code = host_codes.LIBVIRT_ERROR


class DomainRefused(PermanentError):
    code = host_codes.LIBVIRT_REFUSED


_STATES = {
    libvirt.VIR_DOMAIN_RUNNING: DomainState.RUNNING,
    libvirt.VIR_DOMAIN_BLOCKED: DomainState.RUNNING,
    libvirt.VIR_DOMAIN_PAUSED: DomainState.PAUSED,
    libvirt.VIR_DOMAIN_SHUTDOWN: DomainState.RUNNING,  # shutting down: still running
    libvirt.VIR_DOMAIN_SHUTOFF: DomainState.SHUTOFF,
    libvirt.VIR_DOMAIN_CRASHED: DomainState.SHUTOFF,
    libvirt.VIR_DOMAIN_PMSUSPENDED: DomainState.PAUSED,
}
# XML or configuration libvirt will refuse however often we ask.
_REFUSALS = frozenset(
    {
        libvirt.VIR_ERR_XML_ERROR,
        libvirt.VIR_ERR_XML_DETAIL,
        libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
        libvirt.VIR_ERR_INVALID_ARG,
        libvirt.VIR_ERR_NO_SUPPORT,
        libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
    }
)
_quiet = threading.Lock()
_silenced = False


def _silence() -> None:
    """libvirt prints every error to stderr by default; ours are raised instead."""
    global _silenced  # noqa: PLW0603 -- one process-wide libvirt setting
    with _quiet:
        if not _silenced:
            libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
            _silenced = True


def _wrap(e: libvirt.libvirtError, what: str) -> Exception:
    code = e.get_error_code()
    msg = f"{what}: {e.get_error_message() or e}"
    if code in _REFUSALS:
        return DomainRefused(msg, code=host_codes.LIBVIRT_REFUSED)
    return LibvirtError(msg, code=host_codes.LIBVIRT_ERROR, delay=2.0)


class LibvirtDomains:
    """The real DomainDriver (one connection, reopened after a failure)."""

    def __init__(self, uri: str) -> None:
        _silence()
        self.uri = uri
        self._conn: Any = None

    def _c(self) -> Any:
        if self._conn is not None:
            try:
                if self._conn.isAlive():
                    return self._conn
            except libvirt.libvirtError:
                pass
            self._conn = None
        try:
            self._conn = libvirt.open(self.uri)
        except libvirt.libvirtError as e:
            raise LibvirtError(
                f"cannot connect to {self.uri}: {e.get_error_message()}",
                code=host_codes.LIBVIRT_CONNECT,
                delay=5.0,
            ) from e
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(libvirt.libvirtError):
                self._conn.close()
            self._conn = None

    def _lookup(self, name: str) -> Any | None:
        try:
            return self._c().lookupByName(name)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise _wrap(e, f"look up {name}") from e

    def topology(self) -> pinning.HostTopology:
        try:
            topo = pinning.from_capabilities(self._c().getCapabilities())
            if not topo.cells:
                topo = pinning.from_node_info(self._c().getInfo())
        except libvirt.libvirtError as e:
            raise _wrap(e, "read host capabilities") from e
        return topo

    def free_pages(self, size_kib: int, cell: int) -> int:
        try:
            free = self._c().getFreePages([size_kib], cell, 1) or {}
        except libvirt.libvirtError as e:
            if e.get_error_code() not in _REFUSALS:
                raise _wrap(e, "read free pages") from e
            free = {}
        if cell in free and size_kib in free[cell]:
            return int(free[cell][size_kib])
        # Drivers that do not count free pages: the configured pool is the best we know.
        return self.topology().cell(cell).page_count(size_kib)

    def domains(self) -> dict[str, DomainObs]:
        out: dict[str, DomainObs] = {}
        try:
            for dom in self._c().listAllDomains(0):
                name = dom.name()
                if not name.startswith(domains.PREFIX):
                    continue
                try:
                    xml = dom.XMLDesc(0)
                    state = _STATES.get(dom.state()[0], DomainState.OTHER)
                except libvirt.libvirtError as e:
                    if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                        continue  # undefined while we listed
                    raise
                out[name] = DomainObs(domains.read(xml), state)
        except libvirt.libvirtError as e:
            raise _wrap(e, "list domains") from e
        return out

    def state(self, name: str) -> DomainState | None:
        dom = self._lookup(name)
        if dom is None:
            return None
        try:
            return _STATES.get(dom.state()[0], DomainState.OTHER)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise _wrap(e, f"read state of {name}") from e

    def define(self, xml: str) -> None:
        try:
            self._c().defineXML(xml)
        except libvirt.libvirtError as e:
            raise _wrap(e, "define domain") from e

    def start(self, name: str) -> None:
        dom = self._lookup(name)
        if dom is None:
            raise LibvirtError(f"domain {name} is not defined", code=host_codes.LIBVIRT_NO_DOMAIN)
        try:
            if not dom.isActive():
                dom.create()
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_OPERATION_INVALID and dom.isActive():
                return  # started by someone else meanwhile
            raise _wrap(e, f"start {name}") from e

    def shutdown(self, name: str) -> None:
        """Ask the guest to power off (ACPI); returns at once."""
        dom = self._lookup(name)
        if dom is None:
            return
        try:
            if dom.isActive():
                dom.shutdown()
        except libvirt.libvirtError as e:
            if e.get_error_code() in (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_NO_DOMAIN):
                return  # already off or gone
            raise _wrap(e, f"shut down {name}") from e

    def destroy(self, name: str) -> None:
        dom = self._lookup(name)
        if dom is None:
            return
        try:
            if dom.isActive():
                dom.destroy()
        except libvirt.libvirtError as e:
            if e.get_error_code() in (libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_NO_DOMAIN):
                return
            raise _wrap(e, f"destroy {name}") from e

    def undefine(self, name: str) -> None:
        """Undefine with its NVRAM (UEFI vars), so no stale domain keeps the raw disk in use."""
        dom = self._lookup(name)
        if dom is None:
            return
        flags = (
            libvirt.VIR_DOMAIN_UNDEFINE_NVRAM
            | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        )
        try:
            dom.undefineFlags(flags)
        except libvirt.libvirtError as e:
            if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                return
            if e.get_error_code() not in (libvirt.VIR_ERR_INVALID_ARG, libvirt.VIR_ERR_NO_SUPPORT):
                raise _wrap(e, f"undefine {name}") from e
            # Drivers without NVRAM support (libvirt's test driver) refuse the flag.
            try:
                dom.undefineFlags(flags & ~libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
            except libvirt.libvirtError as e2:
                if e2.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                    raise _wrap(e2, f"undefine {name}") from e2
