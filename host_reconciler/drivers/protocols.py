"""The driver Protocols the host engine depends on, and the values they pass.

One Protocol per outside system (libvirt, the management network, DHCP, block
disks, PCI, the readiness gate). This module imports no driver, libvirt,
pyroute2 or subprocess, so the engine (`diff`, `phases`, ...) can name its
drivers' types without loading them; the real drivers and the fakes import it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from host_reconciler import codes as host_codes
from host_reconciler import devicereports, images, pinning
from host_reconciler.drivers import addresses
from host_reconciler.observations import DiskObs, DomainObs, DomainState, IngressSeen, PciObs
from schemas.errors import PermanentError
from schemas.hostplans import DiskIdentity, IngressRule, Network, VmSpec


class DomainDriver(Protocol):
    def topology(self) -> pinning.HostTopology: ...
    def free_pages(self, size_kib: int, cell: int) -> int: ...
    def domains(self) -> dict[str, DomainObs]: ...
    def state(self, name: str) -> DomainState | None: ...
    def define(self, xml: str) -> None: ...
    def start(self, name: str) -> None: ...
    def shutdown(self, name: str) -> None: ...
    def destroy(self, name: str) -> None: ...
    def undefine(self, name: str) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PortState:
    name: str
    isolated: bool


@dataclass(frozen=True, slots=True)
class BridgeState:
    """What the host shows for one management network."""

    name: str
    exists: bool
    up: bool = False
    addresses: tuple[str, ...] = ()  # "10.100.0.1/24", IPv4 only
    ports: tuple[PortState, ...] = ()
    nat: bool = False


def bridge_problems(network: Network, state: BridgeState) -> tuple[str, ...]:
    """Drift of one management network, as short stable phrases (empty when converged)."""
    if not state.exists:
        return (f"bridge {network.bridge} missing",)
    found: list[str] = []
    if not state.up:
        found.append(f"bridge {network.bridge} down")
    prefix = network.subnet.split("/")[1]
    if f"{network.gateway}/{prefix}" not in state.addresses:
        found.append(f"bridge {network.bridge} lacks gateway {network.gateway}/{prefix}")
    found.extend(f"port {p.name} not isolated" for p in state.ports if not p.isolated)
    if not state.nat:
        found.append(f"NAT for {network.subnet} missing")
    return tuple(found)


class NetworkDriver(Protocol):
    """The management bridge, its NAT and its VM ports."""

    def bridge_exists(self, name: str) -> bool: ...

    def ensure_bridge(self, network: Network) -> bool:
        """Bridge present, up, holding the gateway address. True if anything changed."""
        ...

    def ensure_nat(self, network: Network) -> bool:
        """Forwarding on, subnet masqueraded, bridge-to-bridge routing dropped."""
        ...

    def attach_port(self, network: Network, port: str) -> bool:
        """Enslave an existing interface (a VM tap) to the bridge, isolated and up."""
        ...

    def isolate_ports(self, network: Network) -> tuple[str, ...]:
        """Mark every port of the bridge isolated; returns the ports changed."""
        ...

    def observe(self, network: Network) -> BridgeState: ...


class DhcpError(PermanentError):
    code = host_codes.DHCP_ERROR


@dataclass(frozen=True, slots=True)
class Reservation:
    """One VM's DHCP reservation: `name` is also its file name in the hosts dir."""

    name: str
    mac: str
    ip: str

    def __post_init__(self) -> None:
        # Canonical spellings only: a value that would change on normalisation
        # would also make "is this file current?" comparisons flap.
        if addresses.hostname(self.name) != self.name:
            raise addresses.InvalidNetworkValue(
                f"host name must be lower case: {self.name!r}", code=host_codes.NET_INVALID_HOSTNAME
            )
        if addresses.mac(self.mac) != self.mac:
            raise addresses.InvalidNetworkValue(
                f"MAC must be lower case with colons: {self.mac!r}", code=host_codes.NET_INVALID_MAC
            )
        if str(addresses.ipv4(self.ip)) != self.ip:
            raise addresses.InvalidNetworkValue(
                f"IP must be in dotted decimal: {self.ip!r}", code=host_codes.NET_INVALID_IP
            )

    def line(self) -> str:
        return f"{self.mac},{self.ip},{self.name}\n"


@dataclass(frozen=True, slots=True)
class Lease:
    """One line of dnsmasq's lease file (IPv4 only)."""

    expires: int  # epoch seconds; 0 means infinite
    mac: str
    ip: str
    hostname: str | None
    client_id: str | None = None


def reservation_for(vm: VmSpec, network: Network) -> Reservation:
    """The reservation of a VM: its boot slot's (first bundle's) MAC and IP, under its name.

    The VM has one NIC on the management bridge, carrying the boot slot's MAC.
    """
    if not vm.bundles:
        raise DhcpError(f"VM {vm.name} has no slot bundle", code=host_codes.DHCP_NO_BUNDLE)
    boot = vm.bundles[0]
    return Reservation(
        name=addresses.hostname(vm.name),
        mac=addresses.mac(boot.mac_address),
        ip=str(addresses.host_ip(network, boot.private_ip)),
    )


class DhcpDriver(Protocol):
    """Per-VM DHCP reservations on the management network, and the server behind them."""

    def ensure_running(self, network: Network) -> bool:
        """The DHCP server for `network` runs. True if it had to be started."""
        ...

    def ensure_reservation(self, reservation: Reservation) -> bool:
        """The reservation is in force (file current, server told). True if it changed."""
        ...

    def remove_reservation(self, name: str) -> bool:
        """No reservation under `name` (file gone, server told, its lease released).
        True if one was removed."""
        ...

    def reservations(self) -> tuple[Reservation, ...]: ...

    def prune_reservations(self, keep: Collection[str]) -> tuple[str, ...]:
        """Remove every reservation whose name is not in `keep`; returns the names removed."""
        ...

    def leases(self) -> tuple[Lease, ...]: ...


class DiskRefused(PermanentError):
    """The guard said no; nothing was written."""

    code = host_codes.DISK_REFUSED

    def __init__(self, message: str, *, code: str | None = None, device: str = "") -> None:
        super().__init__(message, code=code)
        self.device = device


class IdentityChanged(DiskRefused):
    """The block device behind the approved by-id path is not the approved disk."""

    code = host_codes.DISK_IDENTITY_CHANGED

    def __init__(self, message: str, *, device: str, evidence: dict[str, Any]) -> None:
        super().__init__(message, device=device)
        self.evidence = evidence  # device, resolved, identity: kept with the slot's wipe record


class IdentityMissing(IdentityChanged):
    """The approval of this slot recorded no disk identity: nothing to compare, nothing written.

    A kind of IdentityChanged so every caller that blocks a slot on a changed
    identity blocks it here too, until a new approval records the identity.
    """

    code = host_codes.DISK_IDENTITY_MISSING


@dataclass(frozen=True, slots=True)
class SlotDisk:
    """The disk of one claimed slot, as the plan names it."""

    slot_index: int
    device: str  # the claimed bundle's by-id path
    approved: str | None  # the plan's approved by-id path for this slot (plan.slots)
    os_disk: str  # the node's OS disk by-id path
    identity: DiskIdentity | None = None  # the approved identity of that disk; None: not recorded


def slot_disk(
    slot_index: int,
    device: str,
    approved: Sequence[tuple[int, str]],
    os_disk: str,
    identity: DiskIdentity | None = None,
) -> SlotDisk:
    """Build the SlotDisk of a claimed slot from the plan's approved (slot_index, disk) list.

    `identity` is the approved identity of that slot's disk; it is kept only
    when `device` is the approved disk (otherwise the guard refuses anyway).
    """
    approved_disk = dict(approved).get(slot_index)
    return SlotDisk(slot_index, device, approved_disk, os_disk, identity if device == approved_disk else None)


@dataclass(frozen=True, slots=True)
class DiskSettings:
    by_id_root: Path = Path("/dev/disk/by-id")
    mountinfo: Path = Path("/proc/self/mountinfo")
    swaps: Path = Path("/proc/swaps")
    sysfs_root: Path = Path("/sys")
    # Where a disk's identity is read: the host's sysfs; a lab host's recorded tree, in
    # which each loop device stands in for a recorded namespace (tools/gpuaas_tools/lab/host.py).
    identity_root: Path | None = None  # None: sysfs_root
    sample_count: int = 64
    sample_bytes: int = 64 * 1024
    tool_timeout_s: float = 3600.0


class DiskDriver(Protocol):
    def check(self, disk: SlotDisk) -> None: ...
    def inspect(self, device: str, *, os_disk: str, probe: bool) -> DiskObs: ...
    def write_image(
        self, disk: SlotDisk, image: images.VerifiedImage, *, digest: str, image_format: str
    ) -> dict[str, Any]: ...
    def wipe(self, disk: SlotDisk) -> dict[str, Any]: ...
    def verify(self, disk: SlotDisk) -> dict[str, Any]: ...
    def in_use_by_mount(self, device: str) -> tuple[str, ...]: ...


VFIO = "vfio-pci"  # the kernel driver a passed-through device must be bound to


class PciError(PermanentError):
    code = host_codes.PCI_ERROR


@dataclass(frozen=True, slots=True)
class PciIdentity:
    """What a PCI function says it is (sysfs ids); a reset must not change it."""

    vendor: str | None
    device: str | None
    subsystem_vendor: str | None = None
    subsystem_device: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {
            "vendor": self.vendor,
            "device": self.device,
            "subsystem_vendor": self.subsystem_vendor,
            "subsystem_device": self.subsystem_device,
        }


RESET_DONE = "reset"  # the kernel reset the function (sysfs `reset`: FLR, or the next method it offers)
RESET_UNSUPPORTED = "unsupported"  # the function offers no reset: nothing was done


class PciDriver(Protocol):
    def inspect(self, address: str) -> PciObs: ...
    def bind_vfio(self, address: str) -> None: ...

    def identity(self, address: str) -> PciIdentity | None:
        """The function's ids (None: not on the bus)."""
        ...

    def reset(self, address: str) -> dict[str, Any]:
        """Reset the function where it supports it; {"reset": RESET_DONE|RESET_UNSUPPORTED, ...}.

        PciError when the kernel refuses. Callers reset only the devices of a claimed slot.
        """
        ...


GUEST_MARKER = "/var/lib/gpuaas/slice-ready"  # the file whose existence a guest announces


@dataclass(frozen=True, slots=True)
class GuestAnnounce:
    """What a VM's seed carries so its guest can announce the marker: where to post, and what."""

    url: str
    body: str  # name=<vm name>&token=<hex>: form-encoded, values from a closed alphabet
    devices_url: str = ""  # where the guest posts its device report ("": not asked)
    devices_head: str = ""  # the report's first lines (format, name, token), written by the seed
    telemetry_url: str = ""  # where the guest posts GPU telemetry ("": not asked)
    telemetry_head: str = ""


@dataclass(frozen=True, slots=True)
class ReadinessResult:
    mac: str
    ip: str
    port: int
    lease_s: float  # from the start of the wait until the lease was seen
    ready_s: float  # from the start of the wait until the port accepted (and the marker, devices were heard)
    devices_s: float | None = None  # from the start of the wait until a matching device report (None: not asked)
    devices: dict[str, Any] | None = None  # what the guest reported (GuestDevices.as_dict)


class ReadinessDriver(Protocol):
    def announce_for(self, name: str, gateway: str) -> GuestAnnounce | None:
        """What VM `name`'s seed must carry to announce its guest marker (None: this gate does not ask)."""
        ...

    def wait_ready(
        self,
        mac: str,
        ip: str,
        port: int,
        timeout_s: float,
        *,
        name: str | None = None,
        gateway: str | None = None,
        expect: devicereports.Expectation | None = None,
    ) -> ReadinessResult:
        """Block until the lease, the port (and VM `name`'s marker, heard on `gateway`) are there.

        With `expect`, also until the guest's device report matches it (a mismatch is permanent,
        `host.readiness.device_mismatch`, with the guest's words). ReadinessTimeout otherwise.
        """
        ...

    def guest_telemetry(self, expected: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """Tell the listener each VM's reserved IP (`expected`: name -> IP); return each VM's newest sample."""
        ...

    def refused(self) -> dict[str, int]:
        """Guest posts (device reports, telemetry) refused since start, by reason (never stored)."""
        ...

    def close(self) -> None:
        """Stop what the gate runs (the announcement listener)."""
        ...


class IngressDriver(Protocol):
    """Public endpoints of slice VMs: a DNAT rule and a forward rule per endpoint (argv only).

    Every method is idempotent; `add` and `delete` touch only the rules of the
    endpoint they are given, `delete_foreign` only a rule `observe` listed as foreign.
    """

    def observe(self) -> IngressSeen: ...

    def add(self, bridge: str, rule: IngressRule) -> bool:
        """Both halves of `rule` present (and our chains hooked). True if anything changed."""
        ...

    def delete(self, rule: IngressRule) -> bool:
        """Neither half of `rule` left. True if anything changed."""
        ...

    def delete_foreign(self, line: str) -> bool:
        """Remove one rule of our chains that we did not write (a line of `observe().foreign`)."""
        ...
