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

import sys
from typing import TypeVar

from pydantic import BaseModel

from desired.models.allocations import (
    ALLOCATION_ID_MAX,
    DNS_LABEL_MAX,
    VM_NAME_PREFIX,
    Allocation,
)
from desired.models.base import (
    API_VERSION,
    DIGEST_RE,
    IPV4_RE,
    NAME_RE,
    PROFILE_BAREMETAL,
    PROFILE_SLICE_VM,
    PROFILE_TAG_PREFIX,
    PROFILE_TAGS,
    TIMESTAMP_RE,
    AdminState,
    AllocationState,
    ByIdPath,
    CapacityShape,
    Fabric,
    FabricClaimMode,
    Name,
    PciAddress,
    SharingModel,
    StorageMode,
    Timestamp,
    TopologyRule,
    _Doc,
    ip_int,
)
from desired.models.catalog import (
    Hugepages,
    Image,
    ResourceProfile,
    Sku,
    TopologyPolicy,
    VmProfile,
)
from desired.models.fleet import (
    DEPRECATED_FLEET_KEYS,
    CredentialRef,
    DhcpRange,
    Fleet,
    IngressSettings,
    MachineProviderSpec,
    ManagementNetwork,
    NodeMachine,
    PlacementSettings,
    Pool,
    Region,
    WholeHostReserve,
)
from desired.models.nodes import (
    INGRESS_PORT_MAX,
    INGRESS_PORT_MIN,
    SECTOR_BYTES,
    SYSFS_TEXT_RE,
    WWID_RE,
    Blocker,
    CapacityMetadata,
    FirmwareProfile,
    Node,
    NodeIngress,
    NvmeIdentity,
    PublicAddress,
    Slot,
    SlotMap,
)

__all__ = [
    "ALLOCATION_ID_MAX",
    "API_VERSION",
    "DEPRECATED_FLEET_KEYS",
    "DIGEST_RE",
    "DNS_LABEL_MAX",
    "INGRESS_PORT_MAX",
    "INGRESS_PORT_MIN",
    "IPV4_RE",
    "KINDS",
    "NAME_RE",
    "PROFILE_BAREMETAL",
    "PROFILE_SLICE_VM",
    "PROFILE_TAGS",
    "PROFILE_TAG_PREFIX",
    "SECTOR_BYTES",
    "SYSFS_TEXT_RE",
    "TIMESTAMP_RE",
    "VM_NAME_PREFIX",
    "WWID_RE",
    "AdminState",
    "Allocation",
    "AllocationState",
    "Blocker",
    "ByIdPath",
    "CapacityMetadata",
    "CapacityShape",
    "CredentialRef",
    "DhcpRange",
    "Fabric",
    "FabricClaimMode",
    "FirmwareProfile",
    "Fleet",
    "Hugepages",
    "Image",
    "IngressSettings",
    "MachineProviderSpec",
    "ManagementNetwork",
    "Name",
    "Node",
    "NodeIngress",
    "NodeMachine",
    "NvmeIdentity",
    "PciAddress",
    "PlacementSettings",
    "Pool",
    "PublicAddress",
    "Region",
    "ResourceProfile",
    "SharingModel",
    "Sku",
    "Slot",
    "SlotMap",
    "StorageMode",
    "Timestamp",
    "TopologyPolicy",
    "TopologyRule",
    "VmProfile",
    "WholeHostReserve",
    "compact",
    "ip_int",
]

KINDS: dict[str, type[_Doc]] = {
    "Fleet": Fleet,
    "Sku": Sku,
    "Image": Image,
    "Node": Node,
    "SlotMap": SlotMap,
    "Allocation": Allocation,
}


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


def defined_here(obj: object) -> bool:
    """Is `obj` a class one of this package's modules defines (a model or a vocabulary)?

    The cache allow-lists admit exactly these by module and name.
    """
    return isinstance(obj, type) and obj.__module__.startswith(__name__ + ".")
