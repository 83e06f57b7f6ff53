"""Nodes and their approved slot maps: the hardware a fleet offers."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import (
    Field,
    Strict,
    field_validator,
    model_validator,
)

from desired.models.base import (
    _IPV4,
    IPV4_RE,
    PROFILE_SLICE_VM,
    AdminState,
    ByIdPath,
    Fabric,
    FabricClaimMode,
    Name,
    PciAddress,
    SharingModel,
    StorageMode,
    _Doc,
    _Model,
)
from desired.models.fleet import ManagementNetwork, NodeMachine
from desired.patterns import MAC_RE

# ----------------------------------------------------------------------- Node


class FirmwareProfile(_Model):
    """Deploy-time firmware profile evidence recorded at onboarding.

    Hosts report readiness again at run time; a host report wins over this.
    """

    version: str
    ready: bool = False


PublicAddress = Annotated[str, Field(pattern=IPV4_RE)]
INGRESS_PORT_MIN = 1024  # below: privileged ports the host itself may serve
INGRESS_PORT_MAX = 65535


class NodeIngress(_Model):
    """Where tenants reach the slice VMs of one node: a public address and the ports DNAT'd from it."""

    address: PublicAddress = Field(
        description="Public IPv4 address the host answers on; one of the node's public_addresses."
    )
    port_first: int = Field(
        ge=INGRESS_PORT_MIN,
        le=INGRESS_PORT_MAX,
        description="First public port (1024-65535) handed to slice VMs' SSH and extra ports.",
    )
    port_last: int = Field(
        ge=INGRESS_PORT_MIN,
        le=INGRESS_PORT_MAX,
        description="Last public port (inclusive, 1024-65535, not below port_first); no other node's range on "
        "the same address may overlap it.",
    )


class Node(_Doc):
    kind: Literal["Node"]
    name: Name
    region: Name
    pool: Name
    hardware_tags: Annotated[tuple[Name, ...], Strict(False)] = ()
    profile_tags: Annotated[tuple[Name, ...], Strict(False)]
    baremetal_sku: Name | None = None
    admin_state: Annotated[AdminState, Strict(False)] = AdminState.ACTIVE
    storage_mode: Annotated[StorageMode, Strict(False)] = StorageMode.SHARE
    os_disk: ByIdPath
    org: Name | None = None
    firmware_profile: FirmwareProfile | None = None
    management_network: ManagementNetwork | None = None
    machine: NodeMachine | None = Field(
        default=None, description="The machine provider that deploys this node for baremetal leases."
    )
    public_addresses: Annotated[tuple[PublicAddress, ...], Strict(False)] = Field(
        default=(), description="Public IPv4 addresses this node owns (answers on); ingress.address is one of them."
    )
    ingress: NodeIngress | None = Field(
        default=None,
        description="Public SSH ingress of the node's slice VMs: each slice allocation gets one port of this "
        "range on this address (DNAT to its VM's private address, port 22). Absent: slice VMs of "
        "this node have no public endpoint.",
    )

    @property
    def slice_tagged(self) -> bool:
        return PROFILE_SLICE_VM in self.profile_tags

    @property
    def firmware_ready(self) -> bool:
        return self.firmware_profile is not None and self.firmware_profile.ready


# -------------------------------------------------------------------- SlotMap


class CapacityMetadata(_Model):
    storage_ownership: Literal["slice", "share", "host"] | None = None
    destructive_wipe_policy: str | None = None
    sku: Name | None = None


class Blocker(_Model):
    code: str
    message: str


# What sysfs reports, stripped: printable ASCII, no leading or trailing blank.
SYSFS_TEXT_RE = r"^[!-~]([ -~]{0,62}[!-~])?$"
WWID_RE = r"^(eui|nvme|uuid|naa)\.[0-9A-Za-z._-]{1,200}$"
SECTOR_BYTES = 512


class NvmeIdentity(_Model):
    """The slot disk as discovery read it when the slot was approved (sysfs of the namespace).

    The host reads the same attributes from the block device its by-id link
    resolves to before every write, wipe and verify, and refuses on any
    difference (`host.disk.identity_changed`): a re-pointed or reused by-id
    link never sends a wipe to another disk. Every field recorded here is
    compared; `size_bytes` always is. A loop device (lab hosts) is known by its
    `backing_file` instead of a serial.
    """

    model: Annotated[str, Field(pattern=SYSFS_TEXT_RE)] | None = None
    serial: Annotated[str, Field(pattern=SYSFS_TEXT_RE)] | None = None
    wwid: Annotated[str, Field(pattern=WWID_RE)] | None = None
    size_bytes: int = Field(ge=SECTOR_BYTES, le=2**63 - SECTOR_BYTES, multiple_of=SECTOR_BYTES)  # sysfs: sectors
    backing_file: Annotated[str, Field(pattern=r"^/[^\x00-\x1f\x7f]{0,4095}$")] | None = None

    @model_validator(mode="after")
    def _identifies(self) -> NvmeIdentity:
        if not (self.serial or self.wwid or self.backing_file):
            raise ValueError("an identity needs a serial, a wwid or (loop devices) a backing_file, not a size alone")
        return self


class Slot(_Model):
    slot_index: int = Field(ge=0, le=255)
    gpu_pci_address: PciAddress
    gpu_model: str
    gpu_uuid: str | None = None
    numa_node: int = Field(ge=0, le=64)
    slot_group: Name
    pcie_pair: Name | None = None
    nvme_device: ByIdPath
    nvme_identity: NvmeIdentity | None = None  # recorded by discovery; absent: the by-id path alone
    network_fabric: Annotated[Fabric, Strict(False)]
    fabric_vf_pci_address: PciAddress | None = None
    fabric_parent_device: str | None = None
    fabric_claim_mode: Annotated[FabricClaimMode, Strict(False)] | None = None
    mac_address: Annotated[str, Field(pattern=MAC_RE)]
    private_ip: str
    vcpu_count: int | None = Field(default=None, ge=1)
    memory_mib: int | None = Field(default=None, ge=512)
    sharing_model: Annotated[SharingModel, Strict(False)] = SharingModel.EXCLUSIVE_DEVICE
    max_claims: int = Field(default=1, ge=1)
    parent_slot_id: str | None = None
    compute_milli: int = Field(default=1000, ge=0)
    capacity_metadata: CapacityMetadata = CapacityMetadata.model_construct()
    enabled: bool = True
    blockers: Annotated[tuple[Blocker, ...], Strict(False)] = ()

    @field_validator("private_ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        if not _IPV4.match(value):
            ipaddress.ip_address(value)  # IPv6 and anything unusual: the slow, complete check
        return value


class SlotMap(_Doc):
    kind: Literal["SlotMap"]
    node: Name
    approval_required: bool = False
    slots: Annotated[tuple[Slot, ...], Strict(False)] = Field(min_length=1)
