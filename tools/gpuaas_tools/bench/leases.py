"""Baremetal fleets served by a machine provider, for the lease tests, the kill script and `gpuaas bench baremetal`.

`fleet(...)` is `synthetic.fleet` with a baremetal image in the catalog,
baremetal allocations that name it (and carry an SSH key), a machine
provider in the Fleet and every baremetal node mapped to a machine there.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from desired import models as m
from desired.state import DesiredState
from gpuaas_tools.bench import synthetic

IMAGE = "bench-ubuntu-noble-baremetal"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa bench@gpuaas"


def fleet(
    *,
    provider: dict[str, Any],
    baremetal_nodes: int,
    leases: int,
    slice_nodes: int = 0,
    ssh_address: str | None = None,
    wipe_policy: str = "secure_erase",
    machine_id: str = "bm-{i:05d}",
    slice_machines: bool = False,
) -> DesiredState:
    """`provider`: a Fleet.machine_providers entry (name, kind, url, credentials, ...).

    `slice_machines`: the slice nodes are both-capable and served by the provider too (machines first).
    """
    state = synthetic.fleet(nodes=slice_nodes, baremetal_nodes=baremetal_nodes, baremetal_allocations=leases)
    if state.fleet is None:
        raise ValueError("the synthetic fleet has no Fleet document")
    spec = m.MachineProviderSpec.model_validate(provider)
    state.fleet = state.fleet.model_copy(update={"machine_providers": (spec,)})
    state.images[IMAGE] = m.Image.model_validate(
        {
            "apiVersion": m.API_VERSION,
            "kind": "Image",
            "slug": IMAGE,
            "target": "baremetal",
            "family": "ubuntu",
            "architecture": "amd64",
            "image_format": "maas",
            "source_type": "maas",
            "source_ref": "ubuntu/noble",
            "default_username": "ubuntu",
            "driver_strategy": "preinstalled_nvidia",
            "compatible_skus": [synthetic.BAREMETAL_SKU],
        }
    )
    first = 0 if slice_machines else slice_nodes
    for i in range(first, slice_nodes + baremetal_nodes):
        name = synthetic.node_name(i)
        machine = m.NodeMachine.model_validate(
            {
                "provider": spec.name,
                "machine_id": machine_id.format(i=i - first),
                "ssh_address": ssh_address,
                "wipe_policy": wipe_policy,
            }
        )
        state.nodes[name] = state.nodes[name].model_copy(update={"machine": machine})
    for aid, alloc in list(state.allocations.items()):
        if alloc.sku == synthetic.BAREMETAL_SKU:
            state.allocations[aid] = alloc.model_copy(update={"image": IMAGE, "ssh_keys": (SSH_KEY,)})
    return state


def released(state: DesiredState, allocation_ids: list[str] | None = None) -> DesiredState:
    """A copy of `state` with the allocations named (default: every baremetal one) released in git."""
    out = dataclasses.replace(state, allocations=dict(state.allocations))
    for aid, alloc in state.allocations.items():
        named = aid in allocation_ids if allocation_ids is not None else alloc.sku == synthetic.BAREMETAL_SKU
        if named:
            out.allocations[aid] = alloc.model_copy(update={"state": m.AllocationState.RELEASED})
    return out
