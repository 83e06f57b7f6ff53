"""VM profile resolution: the CPU/memory envelope a slice VM gets.

Seed 000 ("Slice VM Runtime Profiles"): an explicitly requested profile wins
over the SKU's `default_slice_vm_profile`. A multi-GPU request uses a profile
defined for that GPU count and derived from the chosen one-GPU profile when
the SKU declares it; otherwise it scales the one-GPU profile (vCPU and memory
times the GPU count). The result is a snapshot written into the placement,
so later SKU edits never change a running allocation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from desired import models as m
from policies import codes as policies_codes
from schemas import snapshots

# Stable reason codes. Do not change the string values.
NO_PROFILE = policies_codes.PLAN_PROFILE_NONE
UNKNOWN_PROFILE = policies_codes.PLAN_PROFILE_UNKNOWN
COUNT_MISMATCH = policies_codes.PLAN_PROFILE_GPU_COUNT_MISMATCH

_NAMED = re.compile(r"^(?P<prefix>.*)_1g_(?P<vcpu>\d+)c_(?P<mem>\d+)g$")

# The resolved profile is what claims snapshot: its type and codec are in schemas.snapshots.
Profile = snapshots.Profile


@dataclass(frozen=True, slots=True)
class ProfileError:
    code: str
    message: str


def readiness_timeout(sku: m.Sku, profile: m.VmProfile) -> int | None:
    """Seconds a VM of `profile` has to pass readiness: the profile's own, else the SKU's.

    None leaves it to the Fleet's readiness_timeout_seconds, which the host
    plan carries (schemas.hostplans.readiness_timeout picks).
    """
    if profile.readiness_timeout_seconds is not None:
        return profile.readiness_timeout_seconds
    return sku.readiness_timeout_seconds


def _snapshot(sku: m.Sku, name: str, p: m.VmProfile, *, derived: bool = False) -> Profile:
    hp = p.hugepages
    return Profile(
        name,
        p.gpu_count,
        p.vcpu_count,
        p.memory_mib,
        hp.enabled,
        hp.page_size if hp.enabled else None,
        derived,
        readiness_timeout(sku, p),
    )


def scaled_name(base: str, base_profile: m.VmProfile, gpu_count: int) -> str:
    """`h200_1g_24c_64g` x2 -> `h200_2g_48c_128g`; other names get `-x2`."""
    match = _NAMED.match(base)
    if match is None:
        return f"{base}-x{gpu_count}"
    vcpu = base_profile.vcpu_count * gpu_count
    mem_gib = base_profile.memory_mib * gpu_count // 1024
    return f"{match['prefix']}_{gpu_count}g_{vcpu}c_{mem_gib}g"


def _base(sku: m.Sku, requested: str | None) -> tuple[str, m.VmProfile] | ProfileError:
    name = requested if requested is not None else sku.resource_profile.default_slice_vm_profile
    if name is None:
        return ProfileError(NO_PROFILE, f"SKU {sku.sku} has no default_slice_vm_profile and none was requested")
    base = sku.resource_profile.slice_vm_profiles.get(name)
    if base is None:
        return ProfileError(UNKNOWN_PROFILE, f"SKU {sku.sku} has no VM profile {name!r}")
    return name, base


def resolve(sku: m.Sku, gpu_count: int, requested: str | None = None) -> Profile | ProfileError | None:
    """The profile for `gpu_count` GPUs of `sku`; None for baremetal SKUs.

    `requested` is the allocation's explicit `vm_profile`, which wins over
    the SKU default.
    """
    if sku.capacity_shape is m.CapacityShape.BAREMETAL:
        return None
    found = _base(sku, requested)
    if isinstance(found, ProfileError):
        return found
    base_name, base = found
    profiles = sku.resource_profile.slice_vm_profiles
    if base.gpu_count == gpu_count:
        return _snapshot(sku, base_name, base)
    if base.gpu_count != 1:
        return ProfileError(
            COUNT_MISMATCH,
            f"VM profile {base_name} is for {base.gpu_count} GPUs, the allocation asks for "
            f"{gpu_count}; only a one-GPU profile scales",
        )
    # A profile the SKU defines for this count and derives from the base wins.
    for name in sorted(profiles):
        p = profiles[name]
        if p.gpu_count == gpu_count and p.derived_from == base_name:
            return _snapshot(sku, name, p)
    hp = base.hugepages
    return Profile(
        scaled_name(base_name, base, gpu_count),
        gpu_count,
        base.vcpu_count * gpu_count,
        base.memory_mib * gpu_count,
        hp.enabled,
        hp.page_size if hp.enabled else None,
        derived=True,
        readiness_timeout_s=readiness_timeout(sku, base),  # a scaled VM keeps its base profile's timeout
    )
