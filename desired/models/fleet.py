"""The Fleet: regions, pools, management networks, placement, machine providers, ingress."""

from __future__ import annotations

import functools
import ipaddress
from typing import Annotated, Literal

from pydantic import (
    Field,
    Strict,
    model_validator,
)

from desired import defaults
from desired.models.base import Name, _Doc, _Model

# ---------------------------------------------------------------------- Fleet


class DhcpRange(_Model):
    start: str
    end: str


class ManagementNetwork(_Model):
    """The private management network every slice host runs for its VMs."""

    subnet: str = "10.100.0.0/24"
    gateway: str = "10.100.0.1"
    dhcp_range: DhcpRange = DhcpRange.model_construct(start="10.100.0.10", end="10.100.0.250")
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


class WholeHostReserve(_Model):
    """Empty hosts kept for whole-host requests (baremetal, or a slice of 8 GPUs) while they wait."""

    max_hosts: int = Field(
        ge=0,
        le=10_000,
        description="At most this many empty hosts per pool are kept from smaller requests while whole-host "
        "requests wait for that pool. 0: no reserve (as if the setting were absent).",
    )
    after_pending: int = Field(
        default=1,
        ge=1,
        le=10_000,
        description="Whole-host requests that must be waiting before the first host is kept: the reserve is "
        "min(max_hosts, waiting - (after_pending - 1)). Default 1.",
    )


class PlacementSettings(_Model):
    policy: Literal["default", "first-fit", "k8s-least-allocated", "k8s-most-allocated", "seed-rank"] = "default"
    max_claim_attempts: int = Field(default=defaults.CLAIM_CANDIDATES, ge=1, le=100)
    # Expected request-size mix (GPU count -> share); weights the fragmentation score.
    workload_mix: dict[Annotated[int, Strict(False)], float] = Field(
        default_factory=lambda: {1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15}
    )
    # 0.1, not 1.0: terms are upper bounds (leases are released early and bought rounded up), so an hour of
    # delay a term predicts is worth little; 0.1 measured best on the workload suite (docs/placement.md).
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
    whole_host_reserve: WholeHostReserve | None = Field(
        default=None,
        description="Policy default only; absent: no reserve. A request that is not whole-host (whole-host: a "
        "baremetal SKU, or a slice of 8 GPUs) and that the policy would place by opening an empty host stays "
        "pending (plan.sku_unavailable.reserved_for_whole_host) while that host's pool has no more empty hosts "
        "than the reserve: min(max_hosts, W - (after_pending - 1)), W the whole-host requests of the same "
        "planning pass not placed so far (those before it that were refused, and every one after it) that the "
        "pool could serve. Trades smaller requests' waits for whole-host placements in bursts "
        "(docs/placement.md).",
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
    """A machine provider that deploys and erases whole nodes for baremetal leases."""

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
    management_network: ManagementNetwork = ManagementNetwork.model_construct()
    placement: PlacementSettings = PlacementSettings.model_construct()
    graceful_shutdown_timeout_s: int = Field(default=defaults.SHUTDOWN_TIMEOUT_S, ge=1, le=3600)
    readiness_timeout_seconds: int = Field(
        default=defaults.READINESS_TIMEOUT_S,
        ge=30,
        le=900,
        description="Seconds a new VM has to pass readiness (a DHCP lease of its private IP, TCP 22 answering, and "
        "the guest marker /var/lib/gpuaas/slice-ready announced to its host) before the provision "
        "counts as failed (30-900, seed 002's graceful_timeout_seconds).",
    )
    # Earlier names of readiness_timeout_seconds, still read (validation warns at their line).
    graceful_timeout_seconds: int | None = Field(
        default=None,
        ge=30,
        le=900,
        json_schema_extra={"deprecated": True},
        description="Deprecated: the earlier name of readiness_timeout_seconds (same meaning and range).",
    )
    readiness_timeout_s: int | None = Field(
        default=None,
        ge=30,
        le=900,
        json_schema_extra={"deprecated": True},
        description="Deprecated: the earlier name of readiness_timeout_seconds (same meaning and range).",
    )
    host_liveness_ttl_seconds: int = Field(
        default=defaults.HOST_LIVENESS_TTL_S,
        ge=5,
        le=86400,
        description="A node whose host agent reported once and then stayed silent longer than this is "
        "unavailable: no new placements, its allocations flagged host_unreachable (never released).",
    )
    ingress: IngressSettings = Field(
        default=IngressSettings.model_construct(),
        description="Limits of tenant ingress: how many extra guest ports an allocation may expose.",
    )
    max_provision_attempts: int = Field(
        default=defaults.PROVISION_ATTEMPTS,
        ge=1,
        le=20,
        description="Provision attempts per allocation: after a permanent host failure the allocation is placed "
        "again on another node until this many attempts failed, then it is failed. Not "
        "placement.max_claim_attempts (candidate nodes tried within one placement after lost races).",
    )
    max_attempts: int | None = Field(
        default=None,
        ge=1,
        le=20,
        json_schema_extra={"deprecated": True},
        description="Deprecated: the earlier name of max_provision_attempts (same meaning and range).",
    )
    machine_providers: Annotated[tuple[MachineProviderSpec, ...], Strict(False)] = Field(
        default=(), description="Machine providers (MAAS, Ironic) that deploy and erase nodes for baremetal leases."
    )

    @model_validator(mode="after")
    def _renamed_keys(self) -> Fleet:
        # Fleet files written before a rename keep working; the names given for one setting may not disagree.
        for new in dict.fromkeys(DEPRECATED_FLEET_KEYS.values()):
            given = {k: v for k, n in DEPRECATED_FLEET_KEYS.items() if n == new and (v := getattr(self, k)) is not None}
            if not given:
                continue
            if new in self.model_fields_set:
                given[new] = getattr(self, new)
            if len(set(given.values())) > 1:
                said = ", ".join(f"{k} ({v})" for k, v in given.items())
                raise ValueError(f"{said} disagree: keep {new} only")
            object.__setattr__(self, new, next(iter(given.values())))  # frozen model: set once, while validating
        return self


# Fleet keys renamed: the old name -> the new one. Both are read; validation warns at the old one.
DEPRECATED_FLEET_KEYS = {
    "graceful_timeout_seconds": "readiness_timeout_seconds",
    "readiness_timeout_s": "readiness_timeout_seconds",
    "max_attempts": "max_provision_attempts",
}
