"""Names, patterns, scalar types and vocabularies every desired-state kind shares."""

from __future__ import annotations

import datetime as dt
import enum
import ipaddress
import re
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)

from desired.patterns import BY_ID_RE, PCI_RE

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
    # one or two documents); the parse pool's fork server builds them all once (`desired.reading.warm`).
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
