"""Synthetic fleets and simple placements, for benchmarks and race tests.

`fleet` builds a valid DesiredState in memory: N slice-capable nodes with
`slots_per_node` approved, eligible slots each (two NUMA groups), optional
baremetal nodes, and M pending allocations. `first_fit` turns free slots into
Placements with alternatives without the real planner, so the claim path can
be measured and raced on its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Mapping, Sequence
from typing import Any

from desired import models as m
from desired.state import DesiredState
from reconciler.plans import Candidate, Placement, ResolvedProfile

REGION = "bench-1"
SLICE_SKU = "bench-h200-slice"
BAREMETAL_SKU = "bench-h200-baremetal-8g"
IMAGE = "bench-ubuntu-24.04"
_DIGEST = "0" * 63 + "1"
_EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

PROFILE_1G = ResolvedProfile(name="bench_1g_24c_64g", gpu_count=1, vcpu_count=24, memory_mib=65536)


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def _slot(i: int, s: int, per_node: int) -> dict[str, Any]:
    return {
        "slot_index": s,
        "gpu_pci_address": f"0000:{s + 0x10:02x}:00.0",
        "gpu_model": "h200",
        "numa_node": 0 if s < per_node // 2 else 1,
        "slot_group": f"numa{0 if s < per_node // 2 else 1}",
        "nvme_device": f"/dev/disk/by-id/nvme-bench-{i:05d}-{s}",
        "nvme_identity": {"serial": f"BENCH{i:05d}{s}", "size_bytes": 3840755982336},
        "network_fabric": "infiniband",
        "fabric_vf_pci_address": f"0000:{s + 0x80:02x}:00.1",
        "fabric_claim_mode": "per_slot_vf",
        "mac_address": f"52:54:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}:{s:02x}",
        "private_ip": f"10.100.0.{10 + s}",
        "capacity_metadata": {"storage_ownership": "slice", "destructive_wipe_policy": "wipefs-blkdiscard-verify"},
    }


def fleet(
    *,
    nodes: int,
    slots_per_node: int = 8,
    baremetal_nodes: int = 0,
    allocations: int = 0,
    gpus: Sequence[int] = (1,),
    baremetal_allocations: int = 0,
    revision: str | None = None,
    seed: int = 0,
) -> DesiredState:
    """A valid desired state of `nodes` slice nodes (+ baremetal ones) and pending allocations."""
    rng = random.Random(seed)  # noqa: S311 - deterministic synthetic data, not security
    state = DesiredState()
    state.revision = revision
    state.fleet = m.Fleet.model_validate(
        {
            "apiVersion": m.API_VERSION,
            "kind": "Fleet",
            "name": "bench",
            "regions": [{"name": REGION, "pools": [{"name": "slice"}, {"name": "baremetal"}]}],
        }
    )
    state.skus[SLICE_SKU] = m.Sku.model_validate(
        {
            "apiVersion": m.API_VERSION,
            "kind": "Sku",
            "sku": SLICE_SKU,
            "capacity_shape": "gpu_slice",
            "accelerator_vendor": "nvidia",
            "accelerator_model": "h200",
            "allowed_gpu_counts": [1, 2, 4, 8],
            "network_fabric": "infiniband",
            "gpu_hourly_price_minor": 450,
            "resource_profile": {
                "default_slice_vm_profile": PROFILE_1G.name,
                "slice_vm_profiles": {PROFILE_1G.name: {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 65536}},
            },
        }
    )
    state.skus[BAREMETAL_SKU] = m.Sku.model_validate(
        {
            "apiVersion": m.API_VERSION,
            "kind": "Sku",
            "sku": BAREMETAL_SKU,
            "capacity_shape": "baremetal",
            "accelerator_vendor": "nvidia",
            "accelerator_model": "h200",
            "gpu_count": 8,
            "exclusive_node": True,
            "network_fabric": "infiniband",
            "gpu_hourly_price_minor": 399,
        }
    )
    state.images[IMAGE] = m.Image.model_validate(
        {
            "apiVersion": m.API_VERSION,
            "kind": "Image",
            "slug": IMAGE,
            "target": "vm_slice",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "qcow2",
            "source_type": "platform_storage",
            "source_ref": f"images/{IMAGE}.qcow2",
            "digest_sha256": _DIGEST,
            "default_username": "ubuntu",
            "driver_strategy": "preinstalled_nvidia",
        }
    )
    # Whole-node leases need a viable image too (seed 002 §4): MAAS resolves its own alias.
    state.images[f"{IMAGE}-maas"] = m.Image.model_validate(
        {
            "apiVersion": m.API_VERSION,
            "kind": "Image",
            "slug": f"{IMAGE}-maas",
            "target": "baremetal",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "maas",
            "source_type": "maas",
            "source_ref": "ubuntu/noble",
            "default_username": "ubuntu",
            "driver_strategy": "preinstalled_nvidia",
        }
    )
    for i in range(nodes + baremetal_nodes):
        name = node_name(i)
        slice_node = i < nodes
        state.nodes[name] = m.Node.model_validate(
            {
                "apiVersion": m.API_VERSION,
                "kind": "Node",
                "name": name,
                "region": REGION,
                "pool": "slice" if slice_node else "baremetal",
                "profile_tags": ["gpuaas-profile-slice-vm" if slice_node else "gpuaas-profile-baremetal"],
                "baremetal_sku": BAREMETAL_SKU,
                "storage_mode": "slice" if slice_node else "share",
                "os_disk": f"/dev/disk/by-id/nvme-bench-os-{i:05d}",
                "firmware_profile": {"version": "bench-v1", "ready": True},
            }
        )
        if slice_node:
            state.slot_maps[name] = m.SlotMap.model_validate(
                {
                    "apiVersion": m.API_VERSION,
                    "kind": "SlotMap",
                    "node": name,
                    "slots": [_slot(i, s, slots_per_node) for s in range(slots_per_node)],
                }
            )
    for j in range(allocations + baremetal_allocations):
        bare = j >= allocations
        state.allocations[allocation_id(j)] = m.Allocation.model_validate(
            {
                "apiVersion": m.API_VERSION,
                "kind": "Allocation",
                "id": allocation_id(j),
                "tenant": f"tenant-{j % 97}",
                "sku": BAREMETAL_SKU if bare else SLICE_SKU,
                "gpu_count": 8 if bare else rng.choice(list(gpus)),
                "region": REGION,
                "image": None if bare else IMAGE,
                "requested_at": _EPOCH + dt.timedelta(seconds=j),
            }
        )
    state.file_count = len(state.nodes) + len(state.slot_maps) + len(state.allocations) + 4
    return state


def allocation_id(j: int) -> str:
    return f"alloc-{j:07d}"


def first_fit(
    state: DesiredState,
    free: Mapping[str, Sequence[int]],
    allocation_ids: Sequence[str],
    *,
    idle: Sequence[str] = (),
    alternatives: int = 4,
    seed: int | None = None,
) -> list[Placement]:
    """Placements on a local copy of `free` (slices) and `idle` (nodes with no claim, for baremetal).

    Each placement carries up to `alternatives` next candidates. With a seed,
    nodes are visited in a shuffled order, so several racing workers mostly
    pick different nodes, and sometimes the same one.
    """
    left = {n: sorted(s) for n, s in free.items()}
    idle_left = list(idle)
    order = sorted(left)
    if seed is not None:
        rng = random.Random(seed)  # noqa: S311 - deterministic visiting order, not security
        rng.shuffle(order)
        rng.shuffle(idle_left)
    out: list[Placement] = []
    for aid in allocation_ids:
        alloc = state.allocations[aid]
        if state.skus[alloc.sku].capacity_shape is m.CapacityShape.BAREMETAL:
            if not idle_left:
                continue
            node, rest_nodes = idle_left[0], idle_left[1 : 1 + alternatives]
            idle_left.pop(0)
            left.pop(node, None)
            out.append(
                Placement(
                    allocation_id=aid,
                    tenant=alloc.tenant,
                    sku=alloc.sku,
                    capacity_shape="baremetal",
                    gpu_count=alloc.gpu_count,
                    region=alloc.region,
                    node=node,
                    slot_indexes=(),
                    profile=None,
                    image=alloc.image,
                    alternatives=tuple(Candidate(n, ()) for n in rest_nodes),
                )
            )
            continue
        need = alloc.gpu_count
        found = next((n for n in order if len(left.get(n, ())) >= need), None)
        if found is None:
            continue
        node = found
        slots = tuple(left[node][:need])
        left[node] = left[node][need:]
        if node in idle_left:
            idle_left.remove(node)
        out.append(
            Placement(
                allocation_id=aid,
                tenant=alloc.tenant,
                sku=alloc.sku,
                capacity_shape="gpu_slice",
                gpu_count=need,
                region=alloc.region,
                node=node,
                slot_indexes=slots,
                profile=ResolvedProfile(
                    name=f"bench_{need}g", gpu_count=need, vcpu_count=24 * need, memory_mib=65536 * need
                ),
                image=alloc.image,
            )
        )
    # Alternatives come from what this plan leaves free, spread over placements, so
    # taking one after a lost race never steals a slot this plan itself uses later.
    pool = [n for n in reversed(order) if left.get(n)]
    for i, p in enumerate(out):
        if p.capacity_shape != "gpu_slice" or not pool:
            continue
        alts = []
        for j in range(len(pool)):
            n = pool[(i * alternatives + j) % len(pool)]
            if len(left[n]) >= p.gpu_count and n != p.node:
                alts.append(Candidate(n, tuple(left[n][: p.gpu_count])))
            if len(alts) == alternatives:
                break
        out[i] = dataclasses.replace(p, alternatives=tuple(alts))
    return out
