"""The steps behind every host action: provision and release phases, drift heals.

One function per `actions.Step`, each idempotent: run twice, or again after
a crash at any instant, it ends in the same state (a lease taken with
link(2), files renamed into place, libvirt define replacing a definition,
stop and undefine treating a missing domain as done, wipe and verify
repeatable). Each re-checks the live state it acts on rather than trusting
the pass-start observation, and returns extra facts for the journal (image
identity, readiness timings, wipe evidence).

Failures are exceptions of the project's two kinds; `converging` decides
what a failure means (retry, failed VM, cleanup-blocked slot) in one place.
One refusal also leaves a mark on its slot, whatever phase met it: a disk
whose identity is not the approved one (`host.disk.identity_changed`), or
whose approval recorded no identity (`host.disk.identity_missing`), blocks
that slot the way a failed wipe does, with a blocked wipe record carrying the
identity evidence (so `diff.drift` reports `drift.identity.changed` on every
pass): nothing may write, wipe or free that disk until an operator or a new
approval in git acts. `converging` records it for wipe and verify, as any
cleanup failure; `host_checks` and `disk_write` record it themselves before
re-raising, and drop their own mark once the slot's disk passes again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host_reconciler import cloudinit, domains, fetching, imagecache, images, pinning
from host_reconciler.actions import PROVISION_STEPS, Action, Step
from host_reconciler.drivers.protocols import (
    VFIO,
    DhcpDriver,
    DiskDriver,
    DiskRefused,
    DomainDriver,
    IdentityChanged,
    IdentityMissing,
    NetworkDriver,
    PciDriver,
    PciError,
    ReadinessDriver,
    SlotDisk,
    reservation_for,
    slot_disk,
)
from host_reconciler.localstate import LocalState
from host_reconciler.observations import DomainState
from host_reconciler.settings import HostSettings
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import HostPlan, VmSpec

log = logging.getLogger("gpuaas.host")


@dataclass
class Drivers:
    domains: DomainDriver
    disks: DiskDriver
    pci: PciDriver
    dhcp: DhcpDriver
    pack_seed: Callable[[Path], None]  # seed dir -> its ISO (genisoimage, drivers/seediso.py)
    readiness: ReadinessDriver | None = None  # None: not checked (libvirt test driver, no guest)
    network: NetworkDriver | None = None  # None: the bridge is managed elsewhere

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
                topo = pinning.from_numa_nodes([
                    (n.node, n.cpus, [(h.size_kib, h.free) for h in n.hugepages])
                    for n in found.numa_nodes
                ])  # fmt: skip
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
        raise PermanentError(f"slot {slot_index} is not a slot of {vm.allocation_id}", code="host.slot.unknown")

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


Result = dict[str, Any]
StepFn = Callable[[Context, Action, VmSpec | None], Result]


def _vm(vm: VmSpec | None, action: Action) -> VmSpec:
    if vm is None:
        raise PermanentError(
            f"{action.step} needs the plan entry of {action.allocation_id}",
            code="host.plan.missing_vm",
        )
    return vm


# -- provision -----------------------------------------------------------------------------


def lease(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    held = ctx.state.read_leases()
    for b in v.bundles:
        if not ctx.state.acquire_lease(b.slot_index, v.allocation_id):
            holder = ctx.state.read_leases().get(b.slot_index, held.get(b.slot_index))
            raise TemporaryError(f"slot {b.slot_index} is still held by {holder}", code="host.lease.busy", delay=5.0)
    return {}


def host_checks(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    net = ctx.plan.network
    if ctx.drivers.network is not None:
        if ctx.settings.manage_network:
            ctx.drivers.network.ensure_bridge(net)
            ctx.drivers.network.ensure_nat(net)
        elif not ctx.drivers.network.bridge_exists(net.bridge):
            raise PermanentError(f"management bridge {net.bridge} is missing", code="host.network.no_bridge")
    ctx.drivers.dhcp.ensure_running(net)
    opts = ctx.options()
    if opts.domain_type == "kvm" and not Path("/dev/kvm").exists():
        raise PermanentError(
            "/dev/kvm is missing: virtualization is off or kvm is not loaded",
            code="host.kvm_missing",
        )
    placement = ctx.placement(v)
    if v.hugepages:
        size = pinning.HUGEPAGE_KIB.get(v.hugepage_size or "1G")
        if size is None:
            raise PermanentError(f"hugepage size {v.hugepage_size!r} is not 1G or 2M", code="host.hugepages.size")
        cells = placement.guest_cells or (pinning.GuestCell(placement.nodeset[0], (), v.memory_mib),)
        for cell in cells:
            need = -(-cell.memory_mib * 1024 // size)
            free = ctx.free_pages(size, cell.host_node)
            if free < need:
                raise PermanentError(
                    f"{v.allocation_id} needs {need} x {v.hugepage_size or '1G'} pages on NUMA "
                    f"node {cell.host_node}, the host has {free} free",
                    code="host.hugepages.unavailable",
                )
    for b in v.bundles:
        with _identity_blocks(ctx, v, b.slot_index, action.step):
            ctx.drivers.disks.check(ctx.slot_disk(v, b.slot_index))
    _unblock_identity(ctx, v, [b.slot_index for b in v.bundles])
    return {"cpuset": placement.cpuset, "nodeset": list(placement.nodeset)}


@contextlib.contextmanager
def _identity_blocks(ctx: Context, vm: VmSpec, slot: int, step: Step) -> Iterator[None]:
    """Block `slot` when its disk is not the approved one (module docstring), then re-raise."""
    try:
        yield
    except IdentityChanged as e:
        ctx.state.write_wipe(
            slot,
            vm.allocation_id,
            wiped=False,
            verified=False,
            blocked=f"{e.code}: {e.message}",
            evidence={str(step): e.evidence},
        )
        raise


# The refusals that block a slot on its disk identity (IdentityMissing is a kind of IdentityChanged).
_IDENTITY_BLOCKS = (f"{IdentityChanged.code}:", f"{IdentityMissing.code}:")


def _unblock_identity(ctx: Context, vm: VmSpec, slots: list[int]) -> None:
    """The disks of `slots` just passed the guard: drop the identity blocks an earlier pass left.

    Only this allocation's own provisioning marks go (the link was fixed, or git
    approved the new disk); a wipe or verify refusal of a release stays for an
    operator, as every cleanup block does.
    """
    wipes = ctx.state.read_wipes()
    for slot in slots:
        rec = wipes.get(slot)
        if (
            rec is not None
            and rec.allocation_id == vm.allocation_id
            and not rec.wiped
            and (rec.blocked or "").startswith(_IDENTITY_BLOCKS)
            and any(k in PROVISION_STEPS for k in rec.evidence)
        ):
            ctx.state.clear_blocked(slot)


def vfio_check(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    bound: list[str] = []
    for b in v.bundles:
        for address in filter(None, (b.gpu_pci_address, b.fabric_vf_pci_address)):
            dev = ctx.drivers.pci.inspect(address)
            if not dev.present:
                raise PciError(f"slot {b.slot_index}: {address} is not on the PCI bus", code="host.pci.missing")
            if dev.driver == VFIO:
                continue
            if not ctx.settings.vfio_bind:
                raise PciError(
                    f"slot {b.slot_index}: {address} is bound to {dev.driver or 'no driver'}, "
                    f"not {VFIO} (host bootstrap binds it; vfio_bind is off)",
                    code="host.pci.not_vfio",
                )
            ctx.drivers.pci.bind_vfio(address)
            bound.append(address)
    return {"bound": bound} if bound else {}


def _no_image(ctx: Context, v: VmSpec) -> Result:
    if ctx.settings.direct_kernel is not None:
        return {"image": None, "skipped": "direct kernel boot"}
    raise PermanentError(f"{v.allocation_id} names no image", code="host.image.none")


def image_fetch(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    """Seed 002 `image_stat_download`: the claim's image into the cache, by digest (module `fetching`)."""
    v = _vm(vm, action)
    if v.image is None:
        return _no_image(ctx, v)
    digest = images.expected_digest(v.image)
    cache = ctx.image_cache()
    if cache.lookup(digest) is not None:
        cache.touch(digest)
        return {"cached": True}
    s = ctx.settings
    url = images.source_url(v.image, image_dir=s.image_dir, base_url=s.image_base_url, allow_file=s.allow_file_images)

    def make_room(incoming: int) -> None:
        ctx.enforce_image_budget(incoming)
        free = imagecache.free_bytes(cache.root)
        if incoming > free:
            raise TemporaryError(
                f"image {v.image.slug if v.image else '?'} needs {incoming} bytes, {cache.root} has {free} free "
                "after eviction (in-use and pinned images stay)",
                code="host.image.no_space",
                delay=60.0,
            )

    result = fetching.fetch(
        cache,
        url,
        digest,
        max_bytes=s.image_max_bytes,
        timeout_s=s.image_fetch_timeout_s,
        progress=fetching.ThrottledProgress(f"{v.image.slug} for {v.allocation_id}"),
        make_room=make_room,
        wait=False,  # another process fetching it: retry on a later pass, do not stall this one
        allow_file=True,  # source_url already applied allow_file_images
    )
    log.info("image %s sha256:%s cached: %d bytes in %.1f s (resumed from %d, %d attempt(s))",
             v.image.slug, digest, result.entry.size, result.seconds, result.resumed_from,
             result.attempts)  # fmt: skip
    doc = result.as_dict()
    doc.pop("path", None)
    return {"fetch": doc}


def image_verify(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    if v.image is None:
        return _no_image(ctx, v)
    digest = images.expected_digest(v.image)
    verified = images.verify(ctx.image_cache().path(digest), digest)
    return {"image": verified.as_dict()}


def cloud_init_seed(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    gate = ctx.drivers.readiness
    files = cloudinit.render(v, announce=gate.announce_for(v.name, ctx.plan.network.gateway) if gate else None)
    ctx.state.install_seed(v.name, files, build=ctx.drivers.pack_seed)
    return {}


def dhcp_reservation(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    changed = ctx.drivers.dhcp.ensure_reservation(reservation_for(v, ctx.plan.network))
    return {"changed": changed}


def _domains_using(ctx: Context, device: str) -> list[str]:
    return [name for name, d in ctx.drivers.domains.domains().items() if device in d.facts.disks and d.running]


def disk_write(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    if v.image is None:
        return {"skipped": "no image (direct kernel boot)"}
    boot = v.bundles[domains.boot_bundle(v)]
    users = _domains_using(ctx, boot.nvme_device)
    if users:
        raise DiskRefused(
            f"{boot.nvme_device} is the disk of running domain(s) {', '.join(users)}",
            code="host.disk.in_use_by_domain",
            device=boot.nvme_device,
        )
    digest = images.expected_digest(v.image)
    cache = ctx.image_cache()
    recorded = ctx.state.read_journal(v.allocation_id).get("image")
    if isinstance(recorded, dict) and recorded.get("digest") == digest:
        token = images.VerifiedImage(**recorded)
    else:
        token = images.verify(cache.path(digest), digest)
    # The digest's lock keeps an eviction (`gpuaas host image evict`) off the file while it is copied.
    with cache.lock(digest, wait=False), _identity_blocks(ctx, v, boot.slot_index, action.step):
        evidence = ctx.drivers.disks.write_image(
            ctx.slot_disk(v, boot.slot_index), token, digest=digest, image_format=v.image.image_format
        )
    cache.touch(digest)
    _unblock_identity(ctx, v, [boot.slot_index])
    return {"disk_write": evidence}


def define_start(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    ctx.drivers.domains.define(ctx.xml(v))
    ctx.drivers.domains.start(v.name)
    if ctx.drivers.network is not None and ctx.settings.manage_network:
        ctx.drivers.network.isolate_ports(ctx.plan.network)  # the new tap forwards to no other VM
    return {}


def readiness(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    if ctx.drivers.readiness is None:
        return {"readiness": "not checked (no readiness driver: libvirt test driver)"}
    boot = v.bundles[domains.boot_bundle(v)]
    r = ctx.drivers.readiness.wait_ready(
        boot.mac_address.lower(),
        boot.private_ip,
        ctx.settings.readiness_port,
        float(ctx.plan.readiness_timeout_s),
        name=v.name,
        gateway=ctx.plan.network.gateway,
    )
    return {
        "readiness": {
            "ip": r.ip,
            "port": r.port,
            "lease_s": round(r.lease_s, 3),
            "ready_s": round(r.ready_s, 3),
        }
    }


# -- release -------------------------------------------------------------------------------


def _running(state: DomainState | None) -> bool:
    return state in (DomainState.RUNNING, DomainState.PAUSED)


def graceful_stop(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    dd = ctx.drivers.domains
    if not _running(dd.state(v.name)):
        return {"graceful": True, "waited_s": 0.0}
    dd.shutdown(v.name)
    t0 = ctx.clock()
    deadline = t0 + ctx.plan.graceful_timeout_s
    while _running(dd.state(v.name)):
        if ctx.clock() >= deadline:
            return {"graceful": False, "waited_s": round(ctx.clock() - t0, 3)}
        ctx.sleep(min(ctx.settings.graceful_poll_s, max(0.0, deadline - ctx.clock())))
    return {"graceful": True, "waited_s": round(ctx.clock() - t0, 3)}


def hard_stop(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    if not _running(ctx.drivers.domains.state(v.name)):
        return {}
    ctx.drivers.domains.destroy(v.name)
    return {"hard_stopped": True}


def undefine(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    if _running(ctx.drivers.domains.state(v.name)):
        raise TemporaryError(f"{v.name} is still running; not undefining it", code="host.domain.still_running")
    ctx.drivers.domains.undefine(v.name)
    return {}


def remove_reservation(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    removed = ctx.drivers.dhcp.remove_reservation(v.name)
    seed = ctx.state.remove_seed(v.name)
    return {"reservation_removed": removed, "seed_removed": seed}


def _one_slot(action: Action) -> int:
    if len(action.slot_indexes) != 1:
        raise PermanentError(f"{action.step} acts on one slot, got {action.slot_indexes}", code="host.action.slots")
    return action.slot_indexes[0]


def wipe(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    slot = _one_slot(action)
    sd = ctx.slot_disk(v, slot)
    users = sorted(n for n, d in ctx.drivers.domains.domains().items() if sd.device in d.facts.disks)
    if users:  # a defined domain (running or not) still names this disk: never wipe under it
        raise TemporaryError(
            f"slot {slot}: {sd.device} belongs to domain(s) {', '.join(users)}",
            code="host.disk.in_use_by_domain",
            delay=5.0,
        )
    evidence = ctx.drivers.disks.wipe(sd)
    ctx.state.write_wipe(slot, v.allocation_id, wiped=True, verified=False, blocked=None, evidence={"wipe": evidence})
    return {"method": evidence.get("method")}


def verify(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    slot = _one_slot(action)
    evidence = ctx.drivers.disks.verify(ctx.slot_disk(v, slot))
    ctx.state.write_wipe(
        slot,
        v.allocation_id,
        wiped=True,
        verified=True,
        blocked=None,
        evidence={"verify": evidence},
    )
    return {}


def report_free(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    slot = _one_slot(action)
    rec = ctx.state.read_wipes().get(slot)
    if rec is None or rec.allocation_id != v.allocation_id or not rec.verified:
        raise PermanentError(f"slot {slot} has no verified wipe for {v.allocation_id}", code="host.wipe.unproven")
    ctx.state.release_lease(slot, v.allocation_id)
    return {}


# -- drift heals ---------------------------------------------------------------------------


def start_domain(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    ctx.drivers.domains.start(_vm(vm, action).name)
    return {}


def redefine_domain(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = _vm(vm, action)
    ctx.drivers.domains.define(ctx.xml(v))
    return {"note": "persistent definition replaced; a running VM picks it up at its next boot"}


def _planned_names(ctx: Context) -> set[str]:
    return {v.name for v in (*ctx.plan.vms, *ctx.plan.releases)}


def remove_orphan_domain(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    name = action.target
    if not name.startswith(domains.PREFIX) or name in _planned_names(ctx):
        raise PermanentError(f"{name!r} is not an orphan of this host", code="host.heal.not_orphan")
    ctx.drivers.domains.destroy(name)
    ctx.drivers.domains.undefine(name)
    return {}


def remove_stale_reservation(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    if action.target in {v.name for v in ctx.plan.vms}:
        raise PermanentError(f"{action.target} belongs to a planned VM", code="host.heal.not_orphan")
    return {"removed": ctx.drivers.dhcp.remove_reservation(action.target)}


def remove_orphan_seed(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    if action.target in _planned_names(ctx):
        raise PermanentError(f"{action.target} belongs to a plan entry", code="host.heal.not_orphan")
    return {"removed": ctx.state.remove_seed(action.target)}


def remove_orphan_lease(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    slot = _one_slot(action)
    holder = ctx.state.read_leases().get(slot)
    planned = {v.allocation_id for v in (*ctx.plan.vms, *ctx.plan.releases)}
    if holder is None or holder in planned:
        return {}
    disk = next((s.nvme_device for s in ctx.plan.slots if s.slot_index == slot), None)
    if disk and any(disk in d.facts.disks for d in ctx.drivers.domains.domains().values()):
        raise TemporaryError(f"slot {slot} disk is still attached to a domain", code="host.heal.lease_in_use")
    ctx.state.release_lease(slot, holder)
    return {"released": holder}


STEPS: dict[Step, StepFn] = {
    Step.LEASE: lease,
    Step.HOST_CHECKS: host_checks,
    Step.VFIO_CHECK: vfio_check,
    Step.IMAGE_FETCH: image_fetch,
    Step.IMAGE_VERIFY: image_verify,
    Step.CLOUD_INIT_SEED: cloud_init_seed,
    Step.DHCP_RESERVATION: dhcp_reservation,
    Step.DISK_WRITE: disk_write,
    Step.DEFINE_START: define_start,
    Step.READINESS: readiness,
    Step.GRACEFUL_STOP: graceful_stop,
    Step.HARD_STOP: hard_stop,
    Step.UNDEFINE: undefine,
    Step.REMOVE_RESERVATION: remove_reservation,
    Step.WIPE: wipe,
    Step.VERIFY: verify,
    Step.REPORT_FREE: report_free,
    Step.START_DOMAIN: start_domain,
    Step.REDEFINE_DOMAIN: redefine_domain,
    Step.REMOVE_ORPHAN_DOMAIN: remove_orphan_domain,
    Step.REMOVE_STALE_RESERVATION: remove_stale_reservation,
    Step.REMOVE_ORPHAN_SEED: remove_orphan_seed,
    Step.REMOVE_ORPHAN_LEASE: remove_orphan_lease,
}
