"""Synthetic fleets and workloads for capacity planning and benchmarks.

`fleet_documents()` describes N H200-style 8-GPU hosts (two 4-slot NUMA
groups, two PCIe pairs per group, a per-slot VF each, slice-tagged, firmware
ready, one region) that also lease whole as `h200-sxm-baremetal-8g`, so
both shapes compete for every host; `amd_share` turns that fraction of the
hosts into MI300X RoCE slice hosts. `workload_rows()` draws a replayable
request stream at a target offered load, optionally with the lease term
each request would carry (`lease_terms()`: the use rounded up to a product
term, some customers buying longer than they use). Both are pure functions
of their arguments (the seed is an argument); the CLI writes what they
return.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from desired import defaults
from desired import models as m
from desired.state import DesiredState

API = m.API_VERSION
REGION = "synth-1"
H200_SLICE = "h200-sxm-slice"
H200_BAREMETAL = "h200-sxm-baremetal-8g"
AMD_SLICE = "amd-mi300x-roce-slice"
SLOTS = 8


def _mac(node: int, slot: int) -> str:
    # 52:54:00 is the QEMU prefix; 21 bits of node and 3 of slot stay unique fleet-wide.
    value = (node << 3) | slot
    if value >= 1 << 24:
        raise ValueError("too many nodes for unique MACs")
    return f"52:54:00:{value >> 16 & 0xFF:02x}:{value >> 8 & 0xFF:02x}:{value & 0xFF:02x}"


def _pci(bus: int, fn: int = 0) -> str:
    return f"0000:{bus:02x}:00.{fn}"


_GPU_BUS = (0x1B, 0x3C, 0x4B, 0x5C, 0x9A, 0xBB, 0xCD, 0xDC)
_NIC_BUS = (0x1A, 0x3A, 0x4D, 0x5D, 0x9B, 0xBA, 0xCA, 0xDB)


def _skus(amd: bool) -> list[dict[str, Any]]:
    h200 = {
        "apiVersion": API,
        "kind": "Sku",
        "sku": H200_SLICE,
        "display_name": "NVIDIA H200 GPU VM",
        "capacity_shape": "gpu_slice",
        "accelerator_vendor": "nvidia",
        "accelerator_model": "h200",
        "allowed_gpu_counts": [1, 2, 4, 8],
        "exclusive_node": False,
        "same_node_required": True,
        "network_fabric": "infiniband",
        "topology_policy": {
            "gpu_count_1": "any_healthy_slot",
            "gpu_count_2": "numa_aligned_preferred",
            "gpu_count_4": "numa_aligned_required",
            "gpu_count_8": "full_host_slot_group_required",
        },
        "gpu_hourly_price_minor": 450,
        "resource_profile": {
            "fabric": "ib",
            "slice_unit_gpu_count": 1,
            "default_slice_vm_profile": "h200_1g_24c_64g",
            "slice_vm_profiles": {
                "h200_1g_24c_64g": {
                    "gpu_count": 1,
                    "vcpu_count": 24,
                    "memory_mib": 65536,
                    "hugepages": {"enabled": True, "page_size": "1G"},
                },
            },
        },
    }
    bare = {
        "apiVersion": API,
        "kind": "Sku",
        "sku": H200_BAREMETAL,
        "display_name": "NVIDIA H200 full node",
        "capacity_shape": "baremetal",
        "accelerator_vendor": "nvidia",
        "accelerator_model": "h200",
        "gpu_count": 8,
        "exclusive_node": True,
        "network_fabric": "infiniband",
        "gpu_hourly_price_minor": 399,
    }
    out = [h200, bare]
    if amd:
        out.append(
            {
                "apiVersion": API,
                "kind": "Sku",
                "sku": AMD_SLICE,
                "display_name": "AMD MI300X GPU VM (RoCE)",
                "capacity_shape": "gpu_slice",
                "accelerator_vendor": "amd",
                "accelerator_model": "mi300x",
                "allowed_gpu_counts": [1, 2, 4],
                "network_fabric": "roce",
                "topology_policy": {
                    "gpu_count_1": "any_healthy_slot",
                    "gpu_count_2": "numa_aligned_required",
                    "gpu_count_4": "numa_aligned_required",
                },
                "gpu_hourly_price_minor": 380,
                "resource_profile": {
                    "fabric": "roce",
                    "default_slice_vm_profile": "mi300x_1g_24c_128g",
                    "slice_vm_profiles": {
                        "mi300x_1g_24c_128g": {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 131072}
                    },
                },
            }
        )
    return out


def _images() -> list[dict[str, Any]]:
    digest = "0" * 63 + "1"
    return [
        {
            "apiVersion": API,
            "kind": "Image",
            "slug": "ubuntu-24.04-gpuaas-slice",
            "version": "1",
            "target": "vm_slice",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "qcow2",
            "source_type": "platform_storage",
            "source_ref": "images/ubuntu-24.04-gpuaas-slice.qcow2",
            "digest_sha256": digest,
            "default_username": "ubuntu",
            "driver_strategy": "install_on_boot",
        },
        {
            "apiVersion": API,
            "kind": "Image",
            "slug": "ubuntu-24.04-maas",
            "version": "1",
            "target": "baremetal",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "maas",
            "source_type": "maas",
            "source_ref": "ubuntu/noble",
            "default_username": "ubuntu",
            "driver_strategy": "none",
        },
    ]


def node_name(i: int, amd: bool) -> str:
    return f"{'mi300x' if amd else 'h200'}-{i:06d}"


def _node(i: int, amd: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    name = node_name(i, amd)
    model = "mi300x" if amd else "h200"
    fabric = "roce" if amd else "infiniband"
    serial = f"SYN{i:07d}"
    node: dict[str, Any] = {
        "apiVersion": API,
        "kind": "Node",
        "name": name,
        "region": REGION,
        "pool": "mi300x-roce" if amd else "h200",
        "hardware_tags": [f"gpu-{'amd' if amd else 'nvidia'}-{model}", "fabric-cx7" if amd else "fabric-bf3"],
        "profile_tags": ["gpuaas-profile-slice-vm"],
        "admin_state": "active",
        "storage_mode": "slice",
        "os_disk": f"/dev/disk/by-id/nvme-BOSS_{serial}_OS",
        "firmware_profile": {"version": f"{model}-slice-vm-v1", "ready": True},
    }
    if not amd:
        node["baremetal_sku"] = H200_BAREMETAL
    slots = []
    for s in range(SLOTS):
        group = s // 4
        slots.append(
            {
                "slot_index": s,
                "gpu_pci_address": _pci(_GPU_BUS[s]),
                "gpu_model": model,
                "numa_node": group,
                "slot_group": f"numa{group}",
                "pcie_pair": f"numa{group}-pair{(s % 4) // 2}",
                "nvme_device": f"/dev/disk/by-id/nvme-SYN_{serial}_{s}",
                "network_fabric": fabric,
                "nvme_identity": {"serial": f"{serial}_{s}", "size_bytes": 3840755982336},
                "fabric_vf_pci_address": _pci(_NIC_BUS[s], 1),
                "fabric_parent_device": _pci(_NIC_BUS[s]),
                "fabric_claim_mode": "per_slot_vf",
                "mac_address": _mac(i, s),
                "private_ip": f"10.100.0.{10 + s}",
                "capacity_metadata": {
                    "storage_ownership": "slice",
                    "destructive_wipe_policy": "wipefs-blkdiscard-verify",
                },
            }
        )
    slot_map = {"apiVersion": API, "kind": "SlotMap", "node": name, "slots": slots}
    return node, slot_map


@dataclass(frozen=True, slots=True)
class SynthFile:
    path: str  # relative to the fleet root
    document: dict[str, Any]


def fleet_documents(nodes: int, *, amd_share: float = 0.0, seed: int = 0) -> Iterator[SynthFile]:
    """Every document of a synthetic fleet, in the examples/fleet layout."""
    if nodes < 1:
        raise ValueError("a fleet needs at least one node")
    if not 0.0 <= amd_share <= 1.0:
        raise ValueError("amd_share must be between 0 and 1")
    rnd = random.Random(seed)  # noqa: S311  # seeded, reproducible simulation input, not security
    amd_count = round(nodes * amd_share)
    amd_ids = set(rnd.sample(range(nodes), amd_count)) if amd_count else set()
    pools = [{"name": "h200", "description": "H200 hosts sold as GPU VMs or whole"}]
    if amd_count:
        pools.append({"name": "mi300x-roce", "description": "MI300X RoCE GPU VM hosts"})
    yield SynthFile(
        "fleet.yaml",
        {
            "apiVersion": API,
            "kind": "Fleet",
            "name": "synth",
            "regions": [{"name": REGION, "pools": pools}],
            "placement": {
                "policy": "default",
                "max_claim_attempts": defaults.CLAIM_CANDIDATES,
                "workload_mix": {1: 0.4, 2: 0.25, 4: 0.2, 8: 0.15},
            },
        },
    )
    for sku in _skus(bool(amd_count)):
        yield SynthFile(f"skus/{sku['sku']}.yaml", sku)
    for image in _images():
        yield SynthFile(f"images/{image['slug']}.yaml", image)
    for i in range(nodes):
        node, slot_map = _node(i, i in amd_ids)
        yield SynthFile(f"nodes/{node['name']}.yaml", node)
        yield SynthFile(f"slotmaps/{node['name']}.yaml", slot_map)


# ------------------------------------------------------------------ workloads

WORKLOAD_HEADER = ("arrival_s", "duration_s", "sku", "gpus")
LEASE_HEADER = (*WORKLOAD_HEADER, "lease_s")
DEFAULT_MIX: Mapping[int, float] = {1: 0.40, 2: 0.25, 4: 0.20, 8: 0.05}
# Product terms a customer picks from (1 hour, 1 day, 1 week); longer uses buy whole weeks.
DEFAULT_TERMS: tuple[float, ...] = (3600.0, 86400.0, 604800.0)


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    """One request: arrival, how long it holds its GPUs, what it asks for.

    `lease_s` is the term the portal sends with it (`Allocation.lease_hours`),
    an upper bound: the allocation leaves at `duration_s`, or at `lease_s`
    when that comes first (it ran to term). None: an on-demand lease.
    """

    arrival_s: float
    duration_s: float
    sku: str
    gpus: int
    lease_s: float | None = None

    @property
    def departure_s(self) -> float:
        """When the allocation leaves: its use, cut at the end of its term."""
        held = self.duration_s if self.lease_s is None else min(self.duration_s, self.lease_s)
        return self.arrival_s + held


@dataclass(frozen=True, slots=True)
class Offer:
    """One SKU the workload may ask for, the GPUs that serve it, its size mix."""

    sku: str
    gpus: int  # GPUs of the fleet that can serve it
    mix: Mapping[int, float]


def workload_rows(
    offers: list[Offer],
    *,
    load: float,
    requests: int,
    seed: int = 0,
    baremetal: tuple[str, float] | None = None,
    mean_duration_s: float = 3600.0,
    duration_sigma: float = 1.0,
) -> list[WorkloadRow]:
    """A Poisson request stream whose offered load is `load` x the fleet's GPUs.

    Each request picks a SKU in proportion to the GPUs that serve it, then a
    size from that SKU's mix; `baremetal` (SKU, share) turns that share of
    the requests for the first offer into whole-node leases of 8 GPUs.
    Durations are lognormal with the given mean (sigma 0 = exponential), the
    heavy tail cloud leases show.
    """
    if load <= 0 or requests < 1:
        raise ValueError("load must be positive and requests at least 1")
    rnd = random.Random(seed)  # noqa: S311  # seeded, reproducible simulation input, not security
    total = sum(o.gpus for o in offers)
    classes: list[tuple[str, int, float]] = []  # sku, gpus, probability
    bm_share = baremetal[1] if baremetal else 0.0
    for i, o in enumerate(offers):
        w = o.gpus / total
        norm = sum(o.mix.values())
        share = 1.0 - (bm_share if i == 0 else 0.0)
        classes.extend((o.sku, g, w * share * p / norm) for g, p in sorted(o.mix.items()))
        if i == 0 and baremetal:
            classes.append((baremetal[0], 8, w * bm_share))
    mean_gpus = sum(g * p for _, g, p in classes)
    rate = load * total / (mean_duration_s * mean_gpus)
    weights = [p for _, _, p in classes]
    mu = math.log(mean_duration_s) - duration_sigma**2 / 2
    rows = []
    now = 0.0
    for _ in range(requests):
        now += rnd.expovariate(rate)
        sku, g, _ = rnd.choices(classes, weights)[0]
        duration = (
            rnd.expovariate(1 / mean_duration_s) if duration_sigma == 0 else rnd.lognormvariate(mu, duration_sigma)
        )
        rows.append(WorkloadRow(round(now, 3), round(max(duration, 1.0), 3), sku, g))
    return rows


def term_for(planned_s: float, terms: Sequence[float]) -> float:
    """The shortest product term that covers `planned_s`; past the longest, whole multiples of it."""
    for term in terms:
        if planned_s <= term:
            return term
    longest = terms[-1]
    return longest * math.ceil(planned_s / longest)


def lease_terms(
    rows: Sequence[WorkloadRow], *, terms: Sequence[float] = DEFAULT_TERMS, early_release: float = 0.0, seed: int = 0
) -> list[WorkloadRow]:
    """The same requests with the lease term each would carry (`lease_s`).

    A customer buys the shortest term that covers the use it plans. Most plan
    what they use (`duration_s`); an `early_release` share planned longer (up
    to 10x: a job that finished early, a reservation kept "just in case") and
    release early. Every term covers its use, so arrivals, durations and the
    offered load are those of `rows`; only what the planner is told changes.
    A separate random stream (from `seed`) draws the plans.
    """
    if not terms or any(t <= 0 for t in terms) or list(terms) != sorted(terms):
        raise ValueError("terms must be positive and increasing")
    if not 0.0 <= early_release <= 1.0:
        raise ValueError("early_release must be between 0 and 1")
    rnd = random.Random(seed * 7919 + 17)  # noqa: S311  # seeded, reproducible simulation input
    out = []
    for r in rows:
        planned = r.duration_s
        if rnd.random() < early_release:
            planned = r.duration_s / rnd.uniform(0.1, 1.0)
        out.append(replace(r, lease_s=term_for(planned, terms)))
    return out


def desired_state(files: Iterator[SynthFile] | list[SynthFile]) -> DesiredState:
    """Type synthetic documents straight into a DesiredState (no YAML round trip).

    For benchmarks and simulations; `gpuaas fleet synth` writes the same
    documents as files that `gpuaas validate` checks.
    """
    state = DesiredState()
    for f in files:
        doc = f.document
        state.file_count += 1
        kind = doc["kind"]
        if kind == "Fleet":
            state.fleet = m.Fleet.model_validate(doc)
        elif kind == "Sku":
            sku = m.Sku.model_validate(doc)
            state.skus[sku.sku] = sku
        elif kind == "Image":
            image = m.Image.model_validate(doc)
            state.images[image.slug] = image
        elif kind == "Node":
            node = m.Node.model_validate(doc)
            state.nodes[node.name] = node
        elif kind == "SlotMap":
            smap = m.SlotMap.model_validate(doc)
            state.slot_maps[smap.node] = smap
    return state
