"""Fakes for what cannot run on a machine without GPUs, VFIO or a booting guest.

Each implements the same Protocol as its real driver, so the engine runs
unchanged on either and a test of the engine is a test of what ships; each
keeps its state in plain attributes tests can inspect or change to inject
drift. Nothing else is faked: libvirt, disks, files and PostgreSQL are real.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from host_reconciler import codes as host_codes
from host_reconciler.drivers.pci import check_address
from host_reconciler.drivers.protocols import RESET_DONE, VFIO, PciError, PciIdentity
from host_reconciler.observations import PciObs


class FakePci:
    """A PCI bus of GPUs and VFs, all on vfio-pci unless a test says otherwise."""

    def __init__(
        self,
        addresses: Iterable[str] = (),
        *,
        numa: dict[str, int] | None = None,
        allow_bind: bool = False,
        driver: str = VFIO,
        all_present: bool = False,
    ) -> None:
        self.drivers: dict[str, str | None] = {check_address(a): driver for a in addresses}
        self.numa = dict(numa or {})
        self.allow_bind = allow_bind
        self.all_present = all_present  # any valid address exists, on vfio-pci (lab hosts without GPUs)
        self.bound: list[str] = []
        self.resets: list[str] = []  # every address reset, in order
        self.identities: dict[str, PciIdentity] = {}  # default: a generic identity per present device

    def inspect(self, address: str) -> PciObs:
        if address not in self.drivers and self.all_present:
            self.drivers[check_address(address)] = VFIO
        if address not in self.drivers:
            return PciObs(address, present=False)
        return PciObs(address, present=True, driver=self.drivers[address], numa_node=self.numa.get(address))

    def bind_vfio(self, address: str) -> None:
        if not self.allow_bind:
            raise PciError(f"{address} is not on {VFIO} and binding is off", code=host_codes.PCI_NOT_VFIO)
        if address not in self.drivers:
            raise PciError(f"{address} is not on the PCI bus", code=host_codes.PCI_MISSING)
        self.drivers[address] = VFIO
        self.bound.append(address)

    def identity(self, address: str) -> PciIdentity | None:
        if not self.inspect(address).present:
            return None
        return self.identities.get(address, PciIdentity("0x10de", "0x2335", "0x10de", "0x18be"))

    def reset(self, address: str) -> dict[str, Any]:
        if not self.inspect(address).present:
            raise PciError(f"{address} is not on the PCI bus", code=host_codes.PCI_MISSING)
        self.resets.append(address)
        return {"reset": RESET_DONE, "methods": ["flr"]}
