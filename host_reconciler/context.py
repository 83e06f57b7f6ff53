"""The context every host step runs in, and the inputs it builds for them.

`Drivers` holds one implementation per driver Protocol (`drivers/wiring.py`
picks the real ones). `Context` joins a plan, the host settings, the drivers
and the state dir for one pass, and builds what the steps and `observing`
read from them: the host NUMA topology, domain options and the spec digest,
the image cache and its budget, a slot's approved disk, the vCPU placement
and the domain XML.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host_reconciler import cloudinit, domains, imagecache, pinning
from host_reconciler import codes as host_codes
from host_reconciler.actions import Action
from host_reconciler.drivers.protocols import (
    DhcpDriver,
    DiskDriver,
    DomainDriver,
    IngressDriver,
    NetworkDriver,
    PciDriver,
    ReadinessDriver,
    SlotDisk,
    slot_disk,
)
from host_reconciler.localstate import LocalState
from host_reconciler.settings import HostSettings
from schemas.errors import PermanentError
from schemas.hostplans import HostPlan, VmSpec

log = logging.getLogger("gpuaas.host")

# What a step returns: extra facts for the journal (image identity, readiness timings, wipe evidence).
Result = dict[str, Any]


@dataclass
class Drivers:
    domains: DomainDriver
    disks: DiskDriver
    pci: PciDriver
    dhcp: DhcpDriver
    pack_seed: Callable[[Path], None]  # seed dir -> its ISO (genisoimage, drivers/seediso.py)
    readiness: ReadinessDriver | None = None  # None: not checked (libvirt test driver, no guest)
    network: NetworkDriver | None = None  # None: the bridge is managed elsewhere
    ingress: IngressDriver | None = None  # None: public endpoints are not this agent's (nor reported)

    def close(self) -> None:
        self.domains.close()
        if self.readiness is not None:
            self.readiness.close()


@dataclass
class Context:
    plan: HostPlan
    settings: HostSettings
    drivers: Drivers
    state: LocalState
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    _topology: pinning.HostTopology | None = field(default=None, repr=False)

    def host_topology(self) -> pinning.HostTopology:
        """libvirt's NUMA cells; where libvirt has none (its test driver), discovery's."""
        if self._topology is None:
            topo = self.drivers.domains.topology()
            if topo.source == "node-info" and self.settings.discovery_root is not None:
                from host_reconciler.discovery import discovering

                found = discovering.discover(self.settings.discovery_root)
                topo = pinning.from_numa_nodes(
                    [(n.node, n.cpus, [(h.size_kib, h.free) for h in n.hugepages]) for n in found.numa_nodes]
                )
            self._topology = topo
        return self._topology

    def free_pages(self, size_kib: int, node: int) -> int:
        topo = self.host_topology()
        if topo.source == "discovery":
            return topo.cell(node).page_count(size_kib)
        return self.drivers.domains.free_pages(size_kib, node)

    def options(self, vm: VmSpec | None = None) -> domains.DomainOptions:
        seed = None
        if vm is not None:
            iso = self.state.seed_dir(vm.name) / cloudinit.ISO_NAME
            seed = str(iso) if iso.exists() else None
        return self.settings.domain_options(seed_iso=seed)

    def digest(self, vm: VmSpec) -> str:
        return domains.spec_digest(vm, self.plan.network, self.options())

    def image_cache(self) -> imagecache.ImageCache:
        return imagecache.ImageCache(self.settings.image_dir)

    def images_in_use(self) -> set[str]:
        """Digests a provisioning or active VM of this plan names: never evicted."""
        return {vm.image.digest_sha256 for vm in self.plan.vms if vm.image is not None and vm.image.digest_sha256}

    def images_pinned(self) -> set[str]:
        """Digests pinned by this host's settings or by the catalog (the plan's `pinned_images`)."""
        return set(self.settings.image_pins) | set(self.plan.pinned_images)

    def enforce_image_budget(self, incoming: int = 0) -> list[str]:
        """LRU-evict cached images (never in use, never pinned) so `incoming` more bytes fit the budget."""
        evicted = self.image_cache().enforce(
            budget=self.settings.image_budget(),
            in_use=self.images_in_use(),
            pinned=self.images_pinned(),
            incoming=incoming,
        )
        for d in evicted:
            log.info("image cache: evicted sha256:%s (least recently used, over budget)", d)
        return evicted

    def approved(self) -> list[tuple[int, str]]:
        return [(s.slot_index, s.nvme_device) for s in self.plan.slots]

    def slot_disk(self, vm: VmSpec, slot_index: int) -> SlotDisk:
        for b in vm.bundles:
            if b.slot_index == slot_index:
                return slot_disk(
                    slot_index,
                    b.nvme_device,
                    self.approved(),
                    self.plan.os_disk,
                    self.plan.nvme_identity(slot_index),
                )
        raise PermanentError(f"slot {slot_index} is not a slot of {vm.allocation_id}", code=host_codes.SLOT_UNKNOWN)

    def placement(self, vm: VmSpec) -> pinning.CpuPlacement:
        return pinning.place_vcpus(
            vm,
            self.plan.slots,
            self.host_topology(),
            reserved_per_cell=self.settings.reserved_cpus_per_cell,
        )

    def xml(self, vm: VmSpec) -> str:
        return domains.build(
            vm,
            network=self.plan.network,
            placement=self.placement(vm),
            options=self.options(vm),
            digest=self.digest(vm),
        )


def require_vm(vm: VmSpec | None, action: Action) -> VmSpec:
    """The plan entry a step acts on; a step of an allocation the plan no longer names is refused."""
    if vm is None:
        raise PermanentError(
            f"{action.step} needs the plan entry of {action.allocation_id}",
            code=host_codes.PLAN_MISSING_VM,
        )
    return vm


def one_slot(action: Action) -> int:
    """The slot of a per-slot step (wipe, verify, report_free, an orphan lease)."""
    if len(action.slot_indexes) != 1:
        raise PermanentError(f"{action.step} acts on one slot, got {action.slot_indexes}", code=host_codes.ACTION_SLOTS)
    return action.slot_indexes[0]
