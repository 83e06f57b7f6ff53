"""The claim snapshot (`allocation_resource_claims.resource_snapshot`): its types and its only codec.

A slot claim's snapshot is built by PostgreSQL at placement as
`to_jsonb(ROW(...)::gpuaas_slot_claim_snapshot)` (schemas/sql/0006, with
`gpuaas_snapshot_slot`, `gpuaas_snapshot_image`, `gpuaas_snapshot_price`);
`SlotClaimSnapshot` and its parts mirror those composite types field for
field (tests/claims/test_snapshot_codec.py compares them with the catalog
and decodes what the server writes). The one part the SQL does not build is
the VM profile: apply resolves it and passes it in (`profile_to_json`), the
SQL stores the object as given and reads only its `name`, so a later SKU
edit never changes a running VM. The host plan is built from the decoded
snapshot (`slot_claim_from_json`), never from hand-picked keys.

Decoding is strict: a snapshot with a missing, unknown or mistyped key is
refused with a stable code instead of becoming a VM with guessed sizes.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas import codes as schemas_codes
from schemas.errors import PermanentError

# Stable codes. Do not change the string values.
NOT_AN_OBJECT = schemas_codes.SNAPSHOT_PROFILE_NOT_OBJECT
MISSING_KEY = schemas_codes.SNAPSHOT_PROFILE_MISSING_KEY
UNKNOWN_KEY = schemas_codes.SNAPSHOT_PROFILE_UNKNOWN_KEY
BAD_VALUE = schemas_codes.SNAPSHOT_PROFILE_BAD_VALUE
NO_PROFILE = schemas_codes.SNAPSHOT_PROFILE_NONE  # a slot claim (a VM) whose snapshot records no profile
CLAIM_NOT_AN_OBJECT = schemas_codes.SNAPSHOT_CLAIM_NOT_OBJECT
CLAIM_MISSING_KEY = schemas_codes.SNAPSHOT_CLAIM_MISSING_KEY
CLAIM_UNKNOWN_KEY = schemas_codes.SNAPSHOT_CLAIM_UNKNOWN_KEY
CLAIM_BAD_VALUE = schemas_codes.SNAPSHOT_CLAIM_BAD_VALUE


@dataclass(frozen=True, slots=True)
class Profile:
    """A resolved VM profile (policies.profiles resolves it, plans carry it, claims snapshot it)."""

    name: str
    gpu_count: int
    vcpu_count: int
    memory_mib: int
    hugepages_enabled: bool = False
    hugepage_size: str | None = None
    derived: bool = False
    # Seconds the VM has to pass readiness: the VM profile's, else the SKU's; None: the Fleet's, read at plan time.
    readiness_timeout_s: int | None = None


PROFILE_KEYS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Profile))
# Keys written only when set, and read as their default when absent: rows written before them keep
# decoding, and their JSON (and so every host plan built from them) stays byte for byte the same.
OPTIONAL_KEYS: tuple[str, ...] = ("readiness_timeout_s",)
_TYPES: dict[str, Any] = typing.get_type_hints(Profile)


def profile_to_json(profile: Profile | None) -> dict[str, Any] | None:
    """The snapshot JSON of a profile, keys in field order (None for baremetal: no VM)."""
    if profile is None:
        return None
    doc = dataclasses.asdict(profile)
    for key in OPTIONAL_KEYS:
        if doc[key] is None:
            del doc[key]
    return doc


def profile_from_json(doc: object, *, where: str = "claim snapshot") -> Profile | None:
    """The profile a snapshot recorded; PermanentError with a code above if it is not exactly one."""
    if doc is None:
        return None
    if not isinstance(doc, Mapping):
        raise PermanentError(f"{where}: profile is {type(doc).__name__}, not an object", code=NOT_AN_OBJECT)
    missing = [k for k in PROFILE_KEYS if k not in doc and k not in OPTIONAL_KEYS]
    if missing:
        raise PermanentError(f"{where}: profile lacks {', '.join(missing)}", code=MISSING_KEY)
    unknown = sorted(str(k) for k in doc if k not in _TYPES)
    if unknown:
        raise PermanentError(f"{where}: profile has unknown key(s) {', '.join(unknown)}", code=UNKNOWN_KEY)
    for key in PROFILE_KEYS:
        if key in doc and not _fits(doc[key], _TYPES[key]):
            raise PermanentError(f"{where}: profile {key} = {doc[key]!r} is not {_TYPES[key]}", code=BAD_VALUE)
    timeout = doc.get("readiness_timeout_s")
    if timeout is not None and timeout <= 0:
        raise PermanentError(f"{where}: profile readiness_timeout_s = {timeout!r} is not positive", code=BAD_VALUE)
    return Profile(**{k: doc[k] for k in PROFILE_KEYS if k in doc})


def _fits(value: object, hint: Any) -> bool:
    if isinstance(hint, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is int:  # bool is an int subclass; `true` is no vCPU count
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


# ------------------------------------------------------------------ the whole slot claim snapshot


@dataclass(frozen=True, slots=True)
class SnapshotImage:
    """gpuaas_snapshot_image: the image the allocation asked for, as the catalog had it at placement."""

    slug: str
    version: str
    source_ref: str
    digest_sha256: str | None
    image_format: str
    default_username: str | None


@dataclass(frozen=True, slots=True)
class SnapshotPrice:
    """gpuaas_snapshot_price: the SKU's price at placement (what usage bills)."""

    gpu_hourly_price_minor: int | None
    currency: str | None


@dataclass(frozen=True, slots=True)
class SnapshotSlot:
    """gpuaas_snapshot_slot: the slot bundle the VM owns, frozen at placement."""

    slot_index: int
    gpu_pci_address: str
    gpu_uuid: str | None
    gpu_model: str | None
    fabric_vf_pci_address: str | None
    network_fabric: str | None
    nvme_device: str
    mac_address: str
    private_ip: str
    numa_node: int
    slot_group: str | None


@dataclass(frozen=True, slots=True)
class SlotClaimSnapshot:
    """gpuaas_slot_claim_snapshot: one slot claim's snapshot, field for field."""

    allocation_id: str
    tenant: str
    sku: str
    capacity_shape: str | None
    allocation_gpu_count: int
    region: str
    node: str
    profile: Profile | None
    image: SnapshotImage | None
    ssh_keys: tuple[str, ...]
    price: SnapshotPrice | None
    revision: str | None
    claimed_at: str
    gpus: int
    slot: SnapshotSlot


# The composite type each dataclass mirrors (the test reads their attributes from pg_attribute).
SQL_TYPES: dict[str, type[Any]] = {
    "gpuaas_slot_claim_snapshot": SlotClaimSnapshot,
    "gpuaas_snapshot_slot": SnapshotSlot,
    "gpuaas_snapshot_image": SnapshotImage,
    "gpuaas_snapshot_price": SnapshotPrice,
}


def slot_claim_from_json(doc: object, *, where: str = "claim snapshot") -> SlotClaimSnapshot:
    """The snapshot a slot claim recorded; PermanentError with a `snapshot.*` code if it is not exactly one."""
    return _decode(SlotClaimSnapshot, doc, where)  # type: ignore[no-any-return]


def slot_claim_to_json(snap: SlotClaimSnapshot) -> dict[str, Any]:
    """The JSON PostgreSQL writes for `snap` (keys in the composite type's order)."""
    doc = {f.name: getattr(snap, f.name) for f in dataclasses.fields(snap)}
    doc["profile"] = profile_to_json(snap.profile)
    doc["ssh_keys"] = list(snap.ssh_keys)
    for key in ("image", "price", "slot"):
        doc[key] = dataclasses.asdict(doc[key]) if doc[key] is not None else None
    return doc


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _decode(cls: type[Any], doc: object, where: str) -> Any:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    if not isinstance(doc, Mapping):
        what = type(doc).__name__
        raise PermanentError(f"{where}: {cls.__name__} is {what}, not an object", code=CLAIM_NOT_AN_OBJECT)
    missing = [k for k in hints if k not in doc]
    if missing:
        raise PermanentError(f"{where}: {cls.__name__} lacks {', '.join(missing)}", code=CLAIM_MISSING_KEY)
    if len(doc) != len(hints):
        unknown = sorted(str(k) for k in doc if k not in hints)
        raise PermanentError(f"{where}: {cls.__name__} has unknown key(s) {', '.join(unknown)}", code=CLAIM_UNKNOWN_KEY)
    values = {}
    for key, hint in hints.items():
        value = doc[key]
        if key == "profile":
            values[key] = profile_from_json(value, where=where)
            continue
        values[key] = _value(value, hint, f"{where}: {cls.__name__}.{key}")
    return cls(**values)


def _value(value: object, hint: Any, where: str) -> Any:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    for option in options:
        if dataclasses.is_dataclass(option) and isinstance(option, type):
            return _decode(option, value, where)
        if typing.get_origin(option) is tuple:
            if isinstance(value, list) and all(isinstance(v, str) for v in value):
                return tuple(value)
        elif option is not type(None) and _fits(value, option):
            return value
    raise PermanentError(f"{where} = {value!r} is not {hint}", code=CLAIM_BAD_VALUE)
