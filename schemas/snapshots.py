"""The claim snapshot's VM profile: its type and its only JSON codec.

At apply, the resolved profile is written once into every claim's
`resource_snapshot.profile` (schemas/sql/0006 `gpuaas_place` stores the
object as given and reads only its `name`), so a later SKU edit never
changes a running VM. The host plan is built from that snapshot. Both sides
go through `profile_to_json` / `profile_from_json`; the key set is the
fields of `Profile`, defined here once.

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

from schemas.errors import PermanentError

# Stable codes. Do not change the string values.
NOT_AN_OBJECT = "snapshot.profile.not_object"
MISSING_KEY = "snapshot.profile.missing_key"
UNKNOWN_KEY = "snapshot.profile.unknown_key"
BAD_VALUE = "snapshot.profile.bad_value"
NO_PROFILE = "snapshot.profile.none"  # a slot claim (a VM) whose snapshot records no profile


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
