"""PCI/VFIO: is each slot's GPU and fabric VF bound to vfio-pci?

Read-only by default: sysfs tells the bound driver (`driver` symlink) and the
NUMA node. Binding is a host decision (seed 000: devices stay on vfio-pci
while a node is in slice mode; driverctl at bootstrap), so `bind_vfio` works
only when the host setting `vfio_bind` is on, through `driver_override`,
`unbind` and `drivers_probe`: the kernel's documented sysfs interface.

`SysfsPci(root)` reads any tree in the sysfs layout, so tests and the
recorded trees under examples/sysfs/ exercise the same code as a real /sys.
This machine has no GPU and no VFIO: `fakes.FakePci` stands in for binding
behind the same Protocol.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from desired.patterns import PCI_RE
from host_reconciler import codes as host_codes
from host_reconciler.drivers.protocols import RESET_DONE, RESET_UNSUPPORTED, VFIO, PciError, PciIdentity
from host_reconciler.observations import PciObs
from schemas.errors import TemporaryError

_PCI = re.compile(PCI_RE)


def check_address(address: str) -> str:
    if not _PCI.match(address):
        raise PciError(f"not a PCI address: {address!r}", code=host_codes.PCI_INVALID_ADDRESS)
    return address


class SysfsPci:
    def __init__(self, root: Path = Path("/sys"), *, allow_bind: bool = False) -> None:
        self.root = root
        self.allow_bind = allow_bind

    def _dev(self, address: str) -> Path:
        return self.root / "bus" / "pci" / "devices" / check_address(address)

    def inspect(self, address: str) -> PciObs:
        dev = self._dev(address)
        if not dev.exists():
            return PciObs(address, present=False)
        driver = None
        link = dev / "driver"
        if link.is_symlink() or link.exists():
            driver = os.path.basename(os.readlink(link)) if link.is_symlink() else link.resolve().name
        numa: int | None = None
        try:
            numa = int((dev / "numa_node").read_text().strip())
        except (OSError, ValueError):
            numa = None
        return PciObs(
            address,
            present=True,
            driver=driver,
            numa_node=numa if numa is None or numa >= 0 else None,
        )

    def identity(self, address: str) -> PciIdentity | None:
        dev = self._dev(address)
        if not dev.exists():
            return None

        def read(name: str) -> str | None:
            try:
                return (dev / name).read_text().strip() or None
            except OSError:
                return None

        return PciIdentity(read("vendor"), read("device"), read("subsystem_vendor"), read("subsystem_device"))

    def reset(self, address: str) -> dict[str, Any]:
        """Write 1 to the function's sysfs `reset` (the kernel picks FLR, PM or bus reset, see `reset_method`)."""
        dev = self._dev(address)
        knob = dev / "reset"
        if not knob.exists():
            return {"reset": RESET_UNSUPPORTED}
        try:
            methods = (dev / "reset_method").read_text().split()
        except OSError:
            methods = []
        try:
            knob.write_text("1")
        except OSError as e:
            raise PciError(
                f"{address}: the kernel refused the reset: {e.strerror}", code=host_codes.HEALTH_RESET_FAILED
            ) from e
        return {"reset": RESET_DONE, "methods": methods}

    def bind_vfio(self, address: str) -> None:
        if not self.allow_bind:
            raise PciError(
                f"{address} is not on {VFIO} and binding is off (host setting vfio_bind)",
                code=host_codes.PCI_NOT_VFIO,
            )
        dev = self._dev(address)
        if not dev.exists():
            raise PciError(f"{address} is not on the PCI bus", code=host_codes.PCI_MISSING)
        try:
            (dev / "driver_override").write_text(VFIO)
            current = self.inspect(address).driver
            if current and current != VFIO:
                (dev / "driver" / "unbind").write_text(address)
            if self.inspect(address).driver != VFIO:
                (self.root / "bus" / "pci" / "drivers_probe").write_text(address)
        except OSError as e:
            raise TemporaryError(f"binding {address} to {VFIO} failed: {e}", code=host_codes.PCI_BIND_FAILED) from e
        if self.inspect(address).driver != VFIO:
            raise PciError(
                f"{address} did not bind to {VFIO} (is the vfio-pci module loaded?)",
                code=host_codes.PCI_BIND_FAILED,
            )
