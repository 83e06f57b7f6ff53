"""`observe(ctx) -> HostObservation`: read the node through the drivers and the state dir.

The imperative half of "observe, diff, act, report". It reads only: domains
(ours, `gpuaas-*`), DHCP reservations, slot leases, journals, wipe evidence,
seed directories, the approved slot disks (signatures probed only on free
slots: a disk in tenant use carries the tenant's filesystem by design), the
GPUs and VFs, the management network, and, when a discovery root is set,
the discovery gate against the approved slots.
"""

from __future__ import annotations

from typing import Any

from host_reconciler.context import Context
from host_reconciler.drivers.protocols import bridge_problems
from host_reconciler.observations import GateFinding, HostObservation, ReservationObs


def observe(ctx: Context, *, full: bool = True) -> HostObservation:
    """Everything `diff` and `drift` read; `full=False` skips what only drift reads

    (disk probes, PCI, the management network, the discovery gate): the
    pre-act observation of a report-mode pass needs none of it.
    """
    plan = ctx.plan
    drivers = ctx.drivers
    state = ctx.state
    leases = state.read_leases()
    busy = {b.slot_index for vm in (*plan.vms, *plan.releases) for b in vm.bundles} | set(leases)
    disks = {
        s.slot_index: drivers.disks.inspect(s.nvme_device, os_disk=plan.os_disk, probe=s.slot_index not in busy)
        for s in plan.slots
        if full
    }
    pci = {
        a: drivers.pci.inspect(a)
        for s in plan.slots
        for a in (s.gpu_pci_address, s.fabric_vf_pci_address)
        if a and full
    }
    network: tuple[str, ...] = ()
    if drivers.network is not None and full:
        network = bridge_problems(plan.network, drivers.network.observe(plan.network))
    gate, gate_ran = _gate(ctx) if full else ((), False)
    cache = ctx.image_cache()
    return HostObservation(
        domains=drivers.domains.domains(),
        reservations={r.name: ReservationObs(r.name, r.mac, r.ip) for r in drivers.dhcp.reservations()},
        disks=disks,
        pci=pci,
        leases=leases,
        seeds=state.read_seeds(),
        progress=state.progress(),
        release_progress=state.progress("release"),
        wipes=state.read_wipes(),
        gate=gate,
        gate_ran=gate_ran,
        network=network,
        images={e.digest: e for e in cache.entries()},
        image_fetches=tuple(cache.partials()),
        ingress=drivers.ingress.observe() if drivers.ingress is not None else None,
    )


def _gate(ctx: Context) -> tuple[tuple[GateFinding, ...], bool]:
    """Run the discovery gate (host_reconciler.discovery) when a discovery root is set."""
    root = ctx.settings.discovery_root
    if root is None or not ctx.plan.slots:
        return (), False
    from host_reconciler.discovery import discovering, gating

    result = gating.compare(approved_slot_map(ctx), discovering.discover(root))
    return tuple(GateFinding(d.slot_index, d.code, d.message, _s(d.old), _s(d.new)) for d in result.drifts), True


def _identity(m: Any, found: Any) -> Any:
    """The plan's approved disk identity as the SlotMap model spells it (the gate compares it every pass)."""
    return None if found is None else m.NvmeIdentity.model_construct(**found.as_dict())


def approved_slot_map(ctx: Context) -> Any:
    """The approved SlotMap the gate compares with, rebuilt from the plan's approved slots.

    The plan carries every approved slot's identity (GPU, VF, disk, NUMA node),
    which is all the gate compares; the rest of the SlotMap (SKU metadata,
    groups) stays in git.
    """
    from desired import models as m

    slots = tuple(
        m.Slot.model_construct(
            slot_index=s.slot_index,
            gpu_pci_address=s.gpu_pci_address,
            gpu_model="approved",
            numa_node=s.numa_node,
            slot_group=f"numa{s.numa_node}",
            nvme_device=s.nvme_device,
            network_fabric=m.Fabric.NONE,
            fabric_vf_pci_address=s.fabric_vf_pci_address,
            fabric_parent_device=None,
            mac_address=s.mac_address,
            private_ip=s.private_ip,
            nvme_identity=_identity(m, ctx.plan.nvme_identity(s.slot_index)),
        )
        for s in ctx.plan.slots
    )
    return m.SlotMap.model_construct(
        api_version="gpuaas.io/v1alpha1",
        kind="SlotMap",
        node=ctx.plan.node,
        approval_required=False,
        slots=slots,
    )


def _s(v: object) -> str | None:
    return None if v is None else str(v)
