"""Build placement worlds from small ASCII pictures (placement `gabbits` style).

One line per node::

    n1: [ab..|....] draining org=acme

Between the brackets, NUMA slot groups are separated by `|`; inside a group,
consecutive characters pair up as PCIe pairs (slots 0-1, 2-3, ...). Slot
characters:

    .  free            a-z  claimed (slot claim) by allocation `alloc-<letter>`
    #  failed          A-Z  held by a baremetal (node_exclusive) claim, `alloc-bm-<letter>`
    ~  cleanup         !    cleanup_blocked
    -  not approvable (fabric_claim_mode shared_host, no VF)

Words after the picture: `draining`, `maintenance`, `unhealthy`, `org=NAME`,
`region=NAME`, `pool=NAME` (default p1), `roce` (an MI300X RoCE host), `notag` (no slice profile tag),
`fw-off` (firmware not ready), `share` (storage_mode share), `no-bm` (no
baremetal_sku), `bm-only` (a baremetal host without a slot map; use `[]`).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from desired import models as m
from desired.state import DesiredState
from reconciler import plans
from reconciler.placement import planner
from schemas import states

API = m.API_VERSION
REGION = "r1"
SLICE = "h200-sxm-slice"
BAREMETAL = "h200-sxm-baremetal-8g"
ROCE = "amd-mi300x-roce-slice"
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

_LINE = re.compile(r"^\s*(?P<name>[a-z0-9][a-z0-9-]*):\s*\[(?P<slots>[^\]]*)\](?P<words>.*)$")


def aid(letter: str) -> str:
    """The allocation id a picture letter stands for."""
    return f"alloc-{letter.lower()}" if letter.islower() else f"alloc-bm-{letter.lower()}"


def skus() -> dict[str, m.Sku]:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "Sku",
            "sku": SLICE,
            "capacity_shape": "gpu_slice",
            "accelerator_vendor": "nvidia",
            "accelerator_model": "h200",
            "allowed_gpu_counts": [1, 2, 4, 8],
            "network_fabric": "infiniband",
            "gpu_hourly_price_minor": 450,
            "topology_policy": {
                "gpu_count_1": "any_healthy_slot",
                "gpu_count_2": "numa_aligned_preferred",
                "gpu_count_4": "numa_aligned_required",
                "gpu_count_8": "full_host_slot_group_required",
            },
            "resource_profile": {
                "default_slice_vm_profile": "h200_1g_24c_64g",
                "slice_vm_profiles": {
                    "h200_1g_24c_64g": {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 65536},
                    "h200_1g_12c_64g": {"gpu_count": 1, "vcpu_count": 12, "memory_mib": 65536},
                    "h200_2g_48c_128g": {
                        "gpu_count": 2,
                        "vcpu_count": 48,
                        "memory_mib": 131072,
                        "derived_from": "h200_1g_24c_64g",
                    },
                },
            },
        },
        {
            "apiVersion": API,
            "kind": "Sku",
            "sku": BAREMETAL,
            "capacity_shape": "baremetal",
            "accelerator_vendor": "nvidia",
            "accelerator_model": "h200",
            "gpu_count": 8,
            "exclusive_node": True,
            "network_fabric": "infiniband",
            "gpu_hourly_price_minor": 399,
        },
        {
            "apiVersion": API,
            "kind": "Sku",
            "sku": ROCE,
            "capacity_shape": "gpu_slice",
            "accelerator_vendor": "amd",
            "accelerator_model": "mi300x",
            "allowed_gpu_counts": [1, 2, 4],
            "network_fabric": "roce",
            "gpu_hourly_price_minor": 380,
            "topology_policy": {"gpu_count_2": "numa_aligned_required"},
            "resource_profile": {
                "default_slice_vm_profile": "mi300x_1g",
                "slice_vm_profiles": {"mi300x_1g": {"gpu_count": 1, "vcpu_count": 24, "memory_mib": 131072}},
            },
        },
    ]
    out = {}
    for doc in docs:
        sku = m.Sku.model_validate(doc)
        out[sku.sku] = sku
    return out


def images() -> dict[str, m.Image]:
    """A generic slice image and a MAAS image: every picture's requests have a viable one (seed 002 §4).

    Named to sort last, so an image a test adds is the default (the lowest slug wins a tie).
    """
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "Image",
            "slug": "zz-generic-slice",
            "target": "vm_slice",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "qcow2",
            "source_type": "platform_storage",
            "source_ref": "images/zz-generic-slice.qcow2",
            "digest_sha256": "0" * 63 + "1",
            "default_username": "ubuntu",
            "driver_strategy": "install_on_boot",
        },
        {
            "apiVersion": API,
            "kind": "Image",
            "slug": "zz-generic-maas",
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
    return {str(d["slug"]): m.Image.model_validate(d) for d in docs}


@dataclass
class World:
    desired: DesiredState
    observed: plans.Observed
    claims: list[plans.ExistingClaim] = field(default_factory=list)
    _next: int = 0

    def request(
        self,
        sku: str,
        gpus: int,
        *,
        tenant: str = "t",
        region: str = REGION,
        vm_profile: str | None = None,
        aid: str | None = None,
        lease_hours: float | None = None,
    ) -> str:
        """Add a present allocation, requested `_next` minutes after EPOCH; returns its id."""
        self._next += 1
        aid = aid or f"req-{self._next:03d}"
        self.desired.allocations[aid] = m.Allocation.model_validate(
            {
                "apiVersion": API,
                "kind": "Allocation",
                "id": aid,
                "tenant": tenant,
                "sku": sku,
                "gpu_count": gpus,
                "region": region,
                "vm_profile": vm_profile,
                "requested_at": EPOCH + dt.timedelta(minutes=self._next),
                "lease_hours": lease_hours,
            }
        )
        return aid

    def lease(self, letter: str, hours: float | None, *, sku: str = SLICE) -> None:
        """Declare the allocation a picture letter stands for, requested at EPOCH for `hours`."""
        held = [c for c in self.observed.claims if c.allocation_id == aid(letter)]
        assert held, f"no claim of {aid(letter)} in the picture"
        gpus = 8 if letter.isupper() else len(held)
        self.desired.allocations[aid(letter)] = m.Allocation.model_validate(
            {
                "apiVersion": API,
                "kind": "Allocation",
                "id": aid(letter),
                "tenant": "t",
                "sku": BAREMETAL if letter.isupper() else sku,
                "gpu_count": gpus,
                "region": REGION,
                "requested_at": EPOCH,
                "lease_hours": hours,
            }
        )

    def plan(self, policy: str | None = None) -> plans.Plan:
        return planner.plan(self.desired, self.observed, policy=policy)

    def place(self, sku: str, gpus: int, *, policy: str | None = None, **kw: Any) -> tuple[str, tuple[int, ...]] | str:
        """Plan one new request: (node, slots) when placed, else the Pending code."""
        aid = self.request(sku, gpus, **kw)
        result = self.plan(policy)
        for p in result.placements:
            if p.allocation_id == aid:
                return p.node, p.slot_indexes
        for q in result.pending:
            if q.allocation_id == aid:
                return q.code
        raise AssertionError(f"{aid} neither placed nor pending")


def _slot(name: str, index: int, group: int, pair: int, *, roce: bool, approvable: bool) -> dict[str, Any]:
    n = sum(ord(c) for c in name) % 200
    slot: dict[str, Any] = {
        "slot_index": index,
        "gpu_pci_address": f"0000:{16 + index:02x}:00.0",
        "gpu_model": "mi300x" if roce else "h200",
        "numa_node": group,
        "slot_group": f"numa{group}",
        "pcie_pair": f"numa{group}-pair{pair}",
        "nvme_device": f"/dev/disk/by-id/nvme-{name}-{index}",
        "nvme_identity": {"serial": f"PIC{name}{index}", "size_bytes": 3840755982336},
        "network_fabric": "roce" if roce else "infiniband",
        "mac_address": f"52:54:00:{n:02x}:{len(name):02x}:{index:02x}",
        "private_ip": f"10.100.0.{10 + index}",
        "capacity_metadata": {"storage_ownership": "slice", "destructive_wipe_policy": "wipefs-verify"},
    }
    if approvable:
        slot["fabric_claim_mode"] = "per_slot_vf"
        slot["fabric_vf_pci_address"] = f"0000:{64 + index:02x}:00.1"
    else:
        slot["fabric_claim_mode"] = "shared_host"
    return slot


def world(picture: str | None) -> World:
    """Parse a picture (usually the test's docstring) into desired + observed state."""
    assert picture is not None, "the picture lives in the test's docstring"
    desired = DesiredState()
    desired.skus = skus()
    desired.images = images()
    regions: dict[str, dict[str, None]] = {REGION: {"p1": None}}
    claims: list[plans.ExistingClaim] = []
    status: dict[plans.SlotKey, states.SlotStatus] = {}
    unhealthy: set[str] = set()
    placed: set[str] = set()
    for line in picture.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        name, words = match["name"], match["words"].split()
        opts = {w.split("=")[0]: (w.split("=", 1)[1] if "=" in w else True) for w in words}
        roce = "roce" in opts
        region = str(opts.get("region", REGION))
        pool = str(opts.get("pool", "p1"))
        regions.setdefault(region, {})[pool] = None
        node: dict[str, Any] = {
            "apiVersion": API,
            "kind": "Node",
            "name": name,
            "region": region,
            "pool": pool,
            "profile_tags": [
                "gpuaas-profile-baremetal" if "notag" in opts or "bm-only" in opts else "gpuaas-profile-slice-vm"
            ],
            "admin_state": "draining" if "draining" in opts else "maintenance" if "maintenance" in opts else "active",
            "storage_mode": "share" if "share" in opts or "bm-only" in opts else "slice",
            "os_disk": f"/dev/disk/by-id/os-{name}",
            "firmware_profile": {"version": "v1", "ready": "fw-off" not in opts},
        }
        if not roce and "no-bm" not in opts:
            node["baremetal_sku"] = BAREMETAL
        if "org" in opts:
            node["org"] = opts["org"]
        desired.nodes[name] = m.Node.model_validate(node)
        if "unhealthy" in opts:
            unhealthy.add(name)
        slots = []
        index = 0
        groups = match["slots"].split("|") if match["slots"] else []
        for gi, chars in enumerate(groups):
            for ci, ch in enumerate(chars):
                slots.append(_slot(name, index, gi, ci // 2, roce=roce, approvable=ch != "-"))
                if ch.islower():
                    claims.append(
                        plans.ExistingClaim(aid(ch), name, states.ClaimKind.SLOT, index, states.ClaimStatus.ACTIVE)
                    )
                    placed.add(aid(ch))
                elif ch.isupper() and (aid(ch), name) not in {(c.allocation_id, c.node) for c in claims}:
                    claims.append(
                        plans.ExistingClaim(
                            aid(ch), name, states.ClaimKind.NODE_EXCLUSIVE, None, states.ClaimStatus.ACTIVE
                        )
                    )
                    placed.add(aid(ch))
                elif ch in "#~!":
                    status[(name, index)] = {
                        "#": states.SlotStatus.FAILED,
                        "~": states.SlotStatus.CLEANUP,
                        "!": states.SlotStatus.CLEANUP_BLOCKED,
                    }[ch]
                index += 1
        if slots:
            desired.slot_maps[name] = m.SlotMap.model_validate(
                {"apiVersion": API, "kind": "SlotMap", "node": name, "slots": slots}
            )
    desired.fleet = m.Fleet.model_validate(
        {
            "apiVersion": API,
            "kind": "Fleet",
            "name": "pictured",
            "regions": [{"name": r, "pools": [{"name": p} for p in pools]} for r, pools in regions.items()],
        }
    )
    observed = plans.Observed(
        claims=tuple(claims), slot_status=status, unavailable_nodes=frozenset(unhealthy), placed=frozenset(placed)
    )
    return World(desired, observed, claims)
