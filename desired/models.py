"""Typed models of every desired-state kind.

Field names follow the seed design documents (`fabric_claim_mode`,
`fabric_vf_pci_address`, `storage_ownership`, `destructive_wipe_policy`,
`allowed_gpu_counts`, `resource_profile`, ...). pydantic stays at this edge:
the planner and host reconciler read these frozen models, never raw YAML.

Models are strict: a string where an integer belongs is an error, not a
coercion, and unknown fields are refused, so a typo never silently drops a
setting an operator meant to change.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import ipaddress
import re
import sys
from typing import Annotated, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from desired.patterns import BY_ID_RE, MAC_RE, PCI_RE, SSH_KEY_RE

API_VERSION = "gpuaas.io/v1alpha1"

PROFILE_SLICE_VM = "gpuaas-profile-slice-vm"
PROFILE_BAREMETAL = "gpuaas-profile-baremetal"
PROFILE_TAGS = frozenset({PROFILE_SLICE_VM, PROFILE_BAREMETAL})
PROFILE_TAG_PREFIX = "gpuaas-profile-"

NAME_RE = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
DIGEST_RE = r"^[0-9a-f]{64}$"

Name = Annotated[str, Field(pattern=NAME_RE)]
PciAddress = Annotated[str, Field(pattern=PCI_RE)]
ByIdPath = Annotated[str, Field(pattern=BY_ID_RE)]
_by_id = re.compile(BY_ID_RE)
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = re.compile(rf"^{_OCTET}(\.{_OCTET}){{3}}$")
IPV4_RE = _IPV4.pattern  # for the JSON Schemas: the same rule as the fast path

# A timestamp with a time, as YAML 1.1 (PyYAML, the reader) resolves one, the calendar fields in range.
# Unquoted it reaches the model as a datetime; quoted (what a JSON-minded writer produces,
# "2026-11-20T09:05:00Z") as a string that must read the same way. No offset: UTC, as the reader does.
TIMESTAMP_RE = (
    r"^[0-9]{4}-(0?[1-9]|1[0-2])-(0?[1-9]|[12][0-9]|3[01])([Tt]|[ \t]+)([01]?[0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(\.[0-9]*)?([ \t]*(Z|[-+]([01]?[0-9]|2[0-3])(:[0-5][0-9])?))?$"
)
_timestamp = re.compile(TIMESTAMP_RE)


def _quoted_timestamp(value: object) -> object:
    if not isinstance(value, str):
        return value  # a datetime from the reader; anything else fails the strict datetime check
    if not _timestamp.match(value):
        raise ValueError(f"{value!r} is not a date and time like 2026-11-20T09:05:00Z")
    node = yaml.ScalarNode("tag:yaml.org,2002:timestamp", value)
    parsed = yaml.constructor.SafeConstructor().construct_yaml_timestamp(node)  # exactly as if unquoted
    if not isinstance(parsed, dt.datetime):  # the pattern has a time: never a bare date
        raise ValueError(f"{value!r} is not a date and time like 2026-11-20T09:05:00Z")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


Timestamp = Annotated[
    dt.datetime, BeforeValidator(_quoted_timestamp), WithJsonSchema({"type": "string", "pattern": TIMESTAMP_RE})
]


def ip_int(value: str) -> int:
    """Integer of an IP address; the IPv4 fast path matters on 80,000-slot fleets."""
    if _IPV4.match(value):
        a, b, c, d = value.split(".")
        return (int(a) << 24) | (int(b) << 16) | (int(c) << 8) | int(d)
    return int(ipaddress.ip_address(value))


class _Model(BaseModel):
    # defer_build: a validator is built when first used (a command reading a kept base validates
    # one or two documents); the parse pool's fork server builds them all once (`desired.warm`).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)


class _Doc(_Model):
    api_version: Literal["gpuaas.io/v1alpha1"] = Field(alias="apiVersion")
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True, defer_build=True)


# ---------------------------------------------------------------- vocabularies


class CapacityShape(enum.StrEnum):
    BAREMETAL = "baremetal"
    GPU_SLICE = "gpu_slice"


class Fabric(enum.StrEnum):
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"
    NONE = "none"


class TopologyRule(enum.StrEnum):
    ANY_HEALTHY_SLOT = "any_healthy_slot"
    NUMA_ALIGNED_PREFERRED = "numa_aligned_preferred"
    NUMA_ALIGNED_REQUIRED = "numa_aligned_required"
    FULL_HOST_SLOT_GROUP_REQUIRED = "full_host_slot_group_required"


class AdminState(enum.StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    MAINTENANCE = "maintenance"


class StorageMode(enum.StrEnum):
    """Who owns the node's NVMe pool: tenant slices (raw) or the host share."""

    SLICE = "slice"
    SHARE = "share"


class FabricClaimMode(enum.StrEnum):
    PER_SLOT_VF = "per_slot_vf"
    EXCLUSIVE_DEVICE = "exclusive_device"
    SHARED_HOST = "shared_host"


class SharingModel(enum.StrEnum):
    EXCLUSIVE_DEVICE = "exclusive_device"
    MIG_PARTITION = "mig_partition"
    MDEV_VGPU = "mdev_vgpu"
    TIME_SLICED = "time_sliced"
    MPS = "mps"
    SOFTWARE_SHARED = "software_shared"


class AllocationState(enum.StrEnum):
    PRESENT = "present"
    RELEASED = "released"


# ---------------------------------------------------------------------- Fleet


class DhcpRange(_Model):
    start: str
    end: str


class ManagementNetwork(_Model):
    """The private management network every slice host runs for its VMs."""

    subnet: str = "10.100.0.0/24"
    gateway: str = "10.100.0.1"
    dhcp_range: DhcpRange = DhcpRange(start="10.100.0.10", end="10.100.0.250")
    bridge: Name = "gpuaasbr0"

    @model_validator(mode="after")
    def _consistent(self) -> ManagementNetwork:
        net = ipaddress.ip_network(self.subnet, strict=True)
        for label, value in (
            ("gateway", self.gateway),
            ("dhcp_range.start", self.dhcp_range.start),
            ("dhcp_range.end", self.dhcp_range.end),
        ):
            if ipaddress.ip_address(value) not in net:
                raise ValueError(f"{label} {value} is outside subnet {self.subnet}")
        if int(ipaddress.ip_address(self.dhcp_range.start)) > int(ipaddress.ip_address(self.dhcp_range.end)):
            raise ValueError("dhcp_range.start is after dhcp_range.end")
        return self

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return _network(self.subnet)


@functools.lru_cache(maxsize=1024)
def _network(subnet: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """Parsed once per subnet: validation asks for the fleet's network once per slot map (10,000s)."""
    return ipaddress.ip_network(subnet)


class Pool(_Model):
    name: Name
    description: str = ""


class Region(_Model):
    name: Name
    pools: Annotated[tuple[Pool, ...], Strict(False)] = Field(min_length=1)


class PlacementSettings(_Model):
    policy: Literal["default", "first-fit", "k8s-least-allocated", "k8s-most-allocated", "seed-rank"] = "default"
    max_claim_attempts: int = Field(default=5, ge=1, le=100)
    # Expected request-size mix (GPU count -> share); weights the fragmentation score.
    workload_mix: dict[Annotated[int, Strict(False)], float] = Field(
        default_factory=lambda: {1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15}
    )
    # 0.1, not 1.0: terms are upper bounds (leases are released early and bought rounded up), so an hour of
    # delay a term predicts is worth little; 0.1 measured best on the workload suite (docs/placement.md, issue 31).
    lease_end_weight: float = Field(
        default=0.1,
        ge=0,
        allow_inf_nan=False,
        description="Policy default only: what one hour of delay in a host's emptying costs, in expected stranded "
        "GPUs (the unit of the fragmentation score), when a lease with a known end "
        "(Allocation.lease_hours) would outlast every lease already on the host. 0 keeps lease ends "
        "as a tie-break only. Default 0.1.",
    )
    pending_deadline_seconds: int = Field(
        default=86_400,
        ge=0,
        le=90 * 86_400,
        description="How long a request may stay pending (unplaceable) before it ends failed with code "
        "sku_unavailable and its pending reason, counted from when the store first saw it (its "
        "requested_at if later). 0: never. Default 86400 (24 h).",
    )
    pending_deadline_by_sku: dict[Name, Annotated[int, Field(ge=0, le=90 * 86_400)]] = Field(
        default_factory=dict,
        description="Per SKU, overrides pending_deadline_seconds (e.g. 0 for a SKU sold as wait-listed).",
    )


class CredentialRef(_Model):
    """Where a machine provider's secret is read at run time: never the secret itself (never in git)."""

    env: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")] | None = Field(
        default=None, description="Name of an environment variable of the reconciler holding the secret."
    )
    file: Annotated[str, Field(pattern=r"^/[^\x00-\x1f\x7f]{0,4095}$")] | None = Field(
        default=None, description="Absolute path of a file on the reconciler's machine holding the secret."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> CredentialRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("name exactly one of env or file")
        return self


class MachineProviderSpec(_Model):
    """A machine provider that deploys and erases whole nodes for baremetal leases (issue 30)."""

    name: Name = Field(description="The provider's name, which Node.machine.provider refers to.")
    kind: Literal["ironic", "maas"] = Field(
        description="ironic: OpenStack Ironic's REST API (noauth or a token); maas: MAAS REST API 2.0 with OAuth1."
    )
    url: Annotated[str, Field(pattern=r"^https?://[^\s]{1,1000}$")] = Field(
        description="Base URL: Ironic's endpoint (http://host:6385) or MAAS's (http://host:5240/MAAS)."
    )
    credentials: CredentialRef | None = Field(
        default=None,
        description="MAAS: its API key (consumer:token:secret); Ironic: an auth token. "
        "Omitted: no credentials (Ironic with auth_strategy = noauth).",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="Per-request timeout of the provider's API.")
    image_base_url: Annotated[str, Field(pattern=r"^(https?|file)://[^\s]{1,1000}$")] | None = Field(
        default=None,
        description="Ironic: where an image whose source_ref is an alias (not a URL) is served "
        "(the alias is appended). MAAS deploys aliases (osystem/release) itself.",
    )


class NodeMachine(_Model):
    """Which machine provider serves a node for baremetal leases, and the node's id there."""

    provider: Name = Field(description="A name from Fleet.machine_providers.")
    machine_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")] = Field(
        description="The machine's id at the provider: MAAS system_id, Ironic node name or UUID."
    )
    ssh_address: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:\[\]-]{1,255}$")] | None = Field(
        default=None,
        description="host or host:port the readiness check connects to (TCP, default port 22); "
        "omitted: the first address the provider reports.",
    )
    wipe_policy: Literal["secure_erase", "quick_erase"] = Field(
        default="secure_erase", description="How the provider erases the disks when a lease is released."
    )


class IngressSettings(_Model):
    """Fleet-wide limits of tenant ingress (public endpoints of slice VMs)."""

    max_extra_ports: int = Field(
        default=4,
        ge=0,
        le=64,
        description="Most guest ports one Allocation may ask to expose besides SSH (Allocation.extra_ports); "
        "each takes one public port of its node's ingress range.",
    )


class Fleet(_Doc):
    kind: Literal["Fleet"]
    name: Name
    regions: Annotated[tuple[Region, ...], Strict(False)] = Field(min_length=1)
    management_network: ManagementNetwork = ManagementNetwork()
    placement: PlacementSettings = PlacementSettings()
    graceful_shutdown_timeout_s: int = Field(default=120, ge=1, le=3600)
    graceful_timeout_seconds: int = Field(
        default=300,
        ge=30,
        le=900,
        description="Seconds a new VM has to pass readiness (a DHCP lease of its private IP, TCP 22 answering, and "
        "the guest marker /var/lib/gpuaas/slice-ready announced to its host) before the provision "
        "counts as failed (30-900, seed 002).",
    )
    readiness_timeout_s: int | None = Field(
        default=None,
        ge=30,
        le=900,
        json_schema_extra={"deprecated": True},
        description="Deprecated: the earlier name of graceful_timeout_seconds (same meaning and range).",
    )
    host_liveness_ttl_seconds: int = Field(
        default=90,
        ge=5,
        le=86400,
        description="A node whose host agent reported once and then stayed silent longer than this is "
        "unavailable: no new placements, its allocations flagged host_unreachable (never released).",
    )
    ingress: IngressSettings = Field(
        default=IngressSettings(),
        description="Limits of tenant ingress: how many extra guest ports an allocation may expose.",
    )
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Provision attempts per allocation: after a permanent host failure the allocation is placed "
        "again on another node until this many attempts failed, then it is failed.",
    )
    machine_providers: Annotated[tuple[MachineProviderSpec, ...], Strict(False)] = Field(
        default=(), description="Machine providers (MAAS, Ironic) that deploy and erase nodes for baremetal leases."
    )

    @model_validator(mode="after")
    def _one_readiness_timeout(self) -> Fleet:
        # Fleet files written before the seed's name keep working; the two names may not disagree.
        old = self.readiness_timeout_s
        if old is None:
            return self
        if "graceful_timeout_seconds" in self.model_fields_set and old != self.graceful_timeout_seconds:
            raise ValueError(
                f"readiness_timeout_s ({old}, deprecated) and graceful_timeout_seconds "
                f"({self.graceful_timeout_seconds}) disagree: keep graceful_timeout_seconds only"
            )
        object.__setattr__(self, "graceful_timeout_seconds", old)  # frozen model: set once, while validating
        return self


# ------------------------------------------------------------------------ Sku


class Hugepages(_Model):
    enabled: bool = False
    page_size: Literal["2M", "1G"] = "1G"


class VmProfile(_Model):
    gpu_count: int = Field(ge=1, le=8)
    vcpu_count: int = Field(ge=1, le=1024)
    memory_mib: int = Field(ge=512)
    hugepages: Hugepages = Hugepages()
    guest_driver_profile: Name | None = None
    derived_from: Name | None = None  # a key of slice_vm_profiles
    notes: str = ""
    readiness_timeout_seconds: int | None = Field(
        default=None,
        ge=30,
        le=900,
        description="Seconds a VM of this profile has to pass readiness (30-900); wins over the SKU's and the "
        "Fleet's graceful_timeout_seconds. Snapshotted at placement: an edit changes no running VM.",
    )


class ResourceProfile(_Model):
    fabric: str | None = None
    slice_unit_gpu_count: int = Field(default=1, ge=1)
    default_slice_vm_profile: Name | None = None
    # Keys are profile names: they reach claims, plans, the host and every report, so they follow the name rule.
    slice_vm_profiles: dict[Name, VmProfile] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )


class TopologyPolicy(_Model):
    gpu_count_1: Annotated[TopologyRule, Strict(False)] = TopologyRule.ANY_HEALTHY_SLOT
    gpu_count_2: Annotated[TopologyRule, Strict(False)] = TopologyRule.NUMA_ALIGNED_PREFERRED
    gpu_count_4: Annotated[TopologyRule, Strict(False)] = TopologyRule.NUMA_ALIGNED_REQUIRED
    gpu_count_8: Annotated[TopologyRule, Strict(False)] = TopologyRule.FULL_HOST_SLOT_GROUP_REQUIRED

    def rule(self, gpu_count: int) -> TopologyRule:
        return {
            1: self.gpu_count_1,
            2: self.gpu_count_2,
            4: self.gpu_count_4,
            8: self.gpu_count_8,
        }.get(gpu_count, TopologyRule.NUMA_ALIGNED_REQUIRED)


class Sku(_Doc):
    kind: Literal["Sku"]
    sku: Name
    display_name: str = ""
    capacity_shape: Annotated[CapacityShape, Strict(False)]
    accelerator_vendor: Literal["nvidia", "amd"]
    accelerator_model: Name
    allowed_gpu_counts: Annotated[tuple[int, ...], Strict(False)] | None = None
    gpu_count: int | None = Field(default=None, ge=1, le=8)
    exclusive_node: bool = False
    same_node_required: bool = True
    network_fabric: Annotated[Fabric, Strict(False)]
    topology_policy: TopologyPolicy = TopologyPolicy()
    resource_profile: ResourceProfile = ResourceProfile()
    gpu_hourly_price_minor: int = Field(ge=0)
    currency: Literal["USD", "EUR"] = "USD"
    active: bool = True
    readiness_timeout_seconds: int | None = Field(
        default=None,
        ge=30,
        le=900,
        description="gpu_slice: seconds a VM of this SKU has to pass readiness (30-900); wins over the Fleet's "
        "graceful_timeout_seconds, a VM profile's own value wins over it. Snapshotted at placement.",
    )

    @model_validator(mode="after")
    def _shape_fields(self) -> Sku:
        if self.capacity_shape is CapacityShape.BAREMETAL:
            if self.gpu_count is None:
                raise ValueError("a baremetal SKU needs a fixed gpu_count")
            if self.allowed_gpu_counts is not None:
                raise ValueError("a baremetal SKU has a fixed gpu_count, not allowed_gpu_counts")
            if not self.exclusive_node:
                raise ValueError("a baremetal SKU must set exclusive_node: true")
            if self.readiness_timeout_seconds is not None:  # no VM, so no VM readiness gate to bound
                raise ValueError(
                    "readiness_timeout_seconds is for gpu_slice SKUs (a VM's readiness); a baremetal SKU has none"
                )
        else:
            if not self.allowed_gpu_counts:
                raise ValueError("a gpu_slice SKU needs allowed_gpu_counts")
            if self.gpu_count is not None:
                raise ValueError("a gpu_slice SKU uses allowed_gpu_counts, not gpu_count")
            if self.exclusive_node:
                raise ValueError("a gpu_slice SKU cannot be exclusive_node")
        return self

    @property
    def counts(self) -> tuple[int, ...]:
        if self.capacity_shape is CapacityShape.BAREMETAL:
            return (self.gpu_count or 0,)
        return tuple(sorted(set(self.allowed_gpu_counts or ())))


# ---------------------------------------------------------------------- Image


class Image(_Doc):
    kind: Literal["Image"]
    slug: Name
    display_name: str = ""
    version: str = "1"
    target: Literal["vm_slice", "baremetal"]
    family: Literal["ubuntu", "rocky", "debian", "custom"]
    architecture: Literal["amd64", "arm64"]
    accelerator_vendor: Literal["nvidia", "amd", "any"] = "any"
    accelerator_model: str | None = None
    network_fabric: Literal["infiniband", "roce", "ethernet", "none", "any"] = "any"
    image_format: Literal["maas", "qcow2", "raw", "oci"]
    source_type: Literal["maas", "platform_storage", "oci_artifact", "http", "file"]
    source_ref: str = Field(min_length=1, max_length=1024)
    digest_sha256: str | None = None
    size_bytes: int | None = Field(default=None, ge=0)
    cloud_init_supported: bool = True
    guest_agent_supported: bool = False
    default_username: Name
    driver_strategy: Literal["none", "preinstalled_nvidia", "preinstalled_rocm", "install_on_boot"]
    compatible_skus: Annotated[tuple[Name, ...], Strict(False)] = ()
    active: bool = True
    inactive_since: Timestamp | None = None
    cache_pinned: bool = False

    @property
    def immutable_source(self) -> bool:
        # MAAS aliases are resolved by MAAS itself; every other artifact is pinned by digest.
        return self.source_type != "maas"


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
    capacity_metadata: CapacityMetadata = CapacityMetadata()
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


# ----------------------------------------------------------------- Allocation


# The host names a slice VM `gpuaas-<allocation id>` (schemas.hostplans.vm_name): libvirt domain,
# cloud-init hostname and DHCP reservation name. A hostname label is at most 63 characters (RFC 1035), so
# the id must leave room for the prefix; checked here, where the id is declared, not at provision time.
VM_NAME_PREFIX = "gpuaas-"
DNS_LABEL_MAX = 63
ALLOCATION_ID_MAX = DNS_LABEL_MAX - len(VM_NAME_PREFIX)


class Allocation(_Doc):
    kind: Literal["Allocation"]
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{2,62}$", json_schema_extra={"maxLength": ALLOCATION_ID_MAX})]
    tenant: Name
    sku: Name
    gpu_count: int = Field(ge=1, le=8)
    region: Name
    image: Name | None = None
    ssh_keys: Annotated[tuple[Annotated[str, Field(pattern=SSH_KEY_RE)], ...], Strict(False)] = ()
    vm_profile: Name | None = None
    state: Annotated[AllocationState, Strict(False)] = AllocationState.PRESENT
    requested_at: Timestamp
    lease_hours: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Reserved term the customer bought, in hours, as the portal sends it (a product term, not an "
        "estimate): the lease ends lease_hours after requested_at. Absent for on-demand leases, which "
        "run until released. The default placement policy co-locates leases that end around the same "
        "time, so hosts empty together for whole-node requests (docs/placement.md).",
    )
    extra_ports: Annotated[tuple[Annotated[int, Field(ge=1, le=65535)], ...], Strict(False)] = Field(
        default=(),
        description="Guest TCP ports to expose besides SSH (22, always exposed), each on its own public port of "
        "the node's ingress range; at most the Fleet's ingress.max_extra_ports, no repeats.",
    )

    @field_validator("id")
    @classmethod
    def _id_fits_derived_names(cls, value: str) -> str:
        if len(value) > ALLOCATION_ID_MAX:
            raise ValueError(
                f"allocation id is {len(value)} characters; at most {ALLOCATION_ID_MAX}: its VM name "
                f"{VM_NAME_PREFIX}<id> is a hostname, a DNS label of at most {DNS_LABEL_MAX} characters"
            )
        return value


KINDS: dict[str, type[_Doc]] = {
    "Fleet": Fleet,
    "Sku": Sku,
    "Image": Image,
    "Node": Node,
    "SlotMap": SlotMap,
    "Allocation": Allocation,
}


def is_safe_by_id(path: str) -> bool:
    return bool(_by_id.match(path))


# ------------------------------------------------------------ compaction
#
# A 100,000-node tree holds 800,000 slots, and a pydantic instance is heavy:
# each carries its own `__pydantic_fields_set__` set (about 700 bytes for a
# slot) and its own copy of every string the reader made, though most are
# the same across slots and nodes (a GPU model, a slot group, a wipe policy,
# a PCI address, a region). `compact` makes typed documents share them.
# Values stay equal, so nothing a reader of the models sees changes.

# Values of these fields are unique per slot or document: interning them would only grow the interned table.
_UNIQUE_FIELDS = frozenset(
    {
        "mac_address",
        "nvme_device",
        "serial",
        "wwid",
        "gpu_uuid",
        "backing_file",
        "os_disk",
        "id",
        "digest_sha256",
        "source_ref",
        "name",
        "node",
    }
)
# Small leaf models that repeat across slots and nodes (equal ones are one object).
_SHARED_MODELS: tuple[type[BaseModel], ...] = (CapacityMetadata, Hugepages, FirmwareProfile, Blocker, DhcpRange)
_MAX_SHARED = 4096  # distinct values kept for sharing; past it the table starts again (a fleet has a handful)

_M = TypeVar("_M", bound=BaseModel)
# What compact does with a value, by its type (enums, numbers and None are kept as they are).
_KEEP, _STR, _MODEL, _TUPLE = range(4)
_HOW: dict[type, int] = {str: _STR, tuple: _TUPLE, int: _KEEP, bool: _KEEP, float: _KEEP, type(None): _KEEP}
_fields_sets: dict[frozenset[str], set[str]] = {}
_shared: dict[tuple[object, ...], BaseModel] = {}


def compact(model: _M) -> _M:
    """The same model, its strings, field sets and small sub-models shared with equal ones already loaded.

    Only called on models just typed, before any reader holds them: frozen
    models are changed in place (`__dict__` values swapped for equal ones).
    """
    values = model.__dict__
    for key, value in values.items():
        kind = type(value)
        how = _HOW.get(kind)
        if how is None:
            how = _HOW[kind] = _MODEL if issubclass(kind, BaseModel) else _KEEP
        if how == _KEEP:
            continue
        if how == _STR:
            if key not in _UNIQUE_FIELDS:
                values[key] = sys.intern(value)
        elif how == _MODEL:
            values[key] = _leaf(compact(value))
        elif value:  # a tuple
            values[key] = tuple(
                _leaf(compact(v))
                if isinstance(v, BaseModel)
                else sys.intern(v)
                if type(v) is str and key not in _UNIQUE_FIELDS
                else v
                for v in value
            )
    fields = model.__pydantic_fields_set__
    # Never changed after validation (model_copy copies it first), so equal sets can be one object.
    object.__setattr__(model, "__pydantic_fields_set__", _fields_sets.setdefault(frozenset(fields), fields))
    return model


def _leaf(model: _M) -> _M:
    if not isinstance(model, _SHARED_MODELS):
        return model
    key = (type(model), *model.__dict__.values(), *sorted(model.__pydantic_fields_set__))
    try:
        found = _shared.get(key)
    except TypeError:  # an unhashable value: kept as it is
        return model
    if found is not None:
        return found  # type: ignore[return-value]  # same type: the key starts with it
    if len(_shared) >= _MAX_SHARED:
        _shared.clear()
    _shared[key] = model
    return model
