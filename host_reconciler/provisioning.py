"""The provision steps: lease, host checks, VFIO, image, seed, DHCP, disk, domain, readiness.

Each step re-checks the live state it acts on and is idempotent (`phases`).
One refusal also leaves a mark on its slot: a disk whose identity is not the
approved one (`host.disk.identity_changed`), or whose approval recorded no
identity (`host.disk.identity_missing`), blocks that slot the way a failed
wipe does, with a blocked wipe record carrying the identity evidence (so
`diff.drift` reports `drift.identity.changed` on every pass): nothing may
write, wipe or free that disk until an operator or a new approval in git
acts. `converging` records it for wipe and verify, as any cleanup failure;
`host_checks` and `disk_write` record it themselves before re-raising, and
drop their own mark once the slot's disk passes again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from host_reconciler import cloudinit, devicereports, domains, fetching, imagecache, images, pinning
from host_reconciler import codes as host_codes
from host_reconciler.actions import PROVISION_STEPS, Action, Step
from host_reconciler.context import Context, Result, require_vm
from host_reconciler.drivers.protocols import (
    VFIO,
    DiskRefused,
    IdentityChanged,
    IdentityMissing,
    PciError,
    reservation_for,
)
from schemas.errors import PermanentError, TemporaryError
from schemas.hostplans import VmSpec, readiness_timeout

log = logging.getLogger("gpuaas.host")


def lease(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    held = ctx.state.read_leases()
    for b in v.bundles:
        if not ctx.state.acquire_lease(b.slot_index, v.allocation_id):
            holder = ctx.state.read_leases().get(b.slot_index, held.get(b.slot_index))
            raise TemporaryError(
                f"slot {b.slot_index} is still held by {holder}", code=host_codes.LEASE_BUSY, delay=5.0
            )
    return {}


def host_checks(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    net = ctx.plan.network
    if ctx.drivers.network is not None:
        if ctx.settings.manage_network:
            ctx.drivers.network.ensure_bridge(net)
            ctx.drivers.network.ensure_nat(net)
        elif not ctx.drivers.network.bridge_exists(net.bridge):
            raise PermanentError(f"management bridge {net.bridge} is missing", code=host_codes.NETWORK_NO_BRIDGE)
    ctx.drivers.dhcp.ensure_running(net)
    opts = ctx.options()
    if opts.domain_type == "kvm" and not Path("/dev/kvm").exists():
        raise PermanentError(
            "/dev/kvm is missing: virtualization is off or kvm is not loaded",
            code=host_codes.KVM_MISSING,
        )
    placement = ctx.placement(v)
    if v.hugepages:
        size = pinning.HUGEPAGE_KIB.get(v.hugepage_size or "1G")
        if size is None:
            raise PermanentError(f"hugepage size {v.hugepage_size!r} is not 1G or 2M", code=host_codes.HUGEPAGES_SIZE)
        cells = placement.guest_cells or (pinning.GuestCell(placement.nodeset[0], (), v.memory_mib),)
        for cell in cells:
            need = -(-cell.memory_mib * 1024 // size)
            free = ctx.free_pages(size, cell.host_node)
            if free < need:
                raise PermanentError(
                    f"{v.allocation_id} needs {need} x {v.hugepage_size or '1G'} pages on NUMA "
                    f"node {cell.host_node}, the host has {free} free",
                    code=host_codes.HUGEPAGES_UNAVAILABLE,
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
    v = require_vm(vm, action)
    bound: list[str] = []
    for b in v.bundles:
        for address in filter(None, (b.gpu_pci_address, b.fabric_vf_pci_address)):
            dev = ctx.drivers.pci.inspect(address)
            if not dev.present:
                raise PciError(f"slot {b.slot_index}: {address} is not on the PCI bus", code=host_codes.PCI_MISSING)
            if dev.driver == VFIO:
                continue
            if not ctx.settings.vfio_bind:
                raise PciError(
                    f"slot {b.slot_index}: {address} is bound to {dev.driver or 'no driver'}, "
                    f"not {VFIO} (host bootstrap binds it; vfio_bind is off)",
                    code=host_codes.PCI_NOT_VFIO,
                )
            ctx.drivers.pci.bind_vfio(address)
            bound.append(address)
    return {"bound": bound} if bound else {}


def _no_image(ctx: Context, v: VmSpec) -> Result:
    if ctx.settings.direct_kernel is not None:
        return {"image": None, "skipped": "direct kernel boot"}
    raise PermanentError(f"{v.allocation_id} names no image", code=host_codes.IMAGE_NONE)


def image_fetch(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    """Seed 002 `image_stat_download`: the claim's image into the cache, by digest (module `fetching`)."""
    v = require_vm(vm, action)
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
                code=host_codes.IMAGE_NO_SPACE,
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
    log.info(
        "image %s sha256:%s cached: %d bytes in %.1f s (resumed from %d, %d attempt(s))",
        v.image.slug,
        digest,
        result.entry.size,
        result.seconds,
        result.resumed_from,
        result.attempts,
    )
    doc = result.as_dict()
    doc.pop("path", None)
    return {"fetch": doc}


def image_verify(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    if v.image is None:
        return _no_image(ctx, v)
    digest = images.expected_digest(v.image)
    verified = images.verify(ctx.image_cache().path(digest), digest)
    return {"image": verified.as_dict()}


def cloud_init_seed(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    gate = ctx.drivers.readiness
    files = cloudinit.render(v, announce=gate.announce_for(v.name, ctx.plan.network.gateway) if gate else None)
    ctx.state.install_seed(v.name, files, build=ctx.drivers.pack_seed)
    return {}


def dhcp_reservation(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    changed = ctx.drivers.dhcp.ensure_reservation(reservation_for(v, ctx.plan.network))
    return {"changed": changed}


def _domains_using(ctx: Context, device: str) -> list[str]:
    return [name for name, d in ctx.drivers.domains.domains().items() if device in d.facts.disks and d.running]


def disk_write(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    if v.image is None:
        return {"skipped": "no image (direct kernel boot)"}
    boot = v.bundles[domains.boot_bundle(v)]
    users = _domains_using(ctx, boot.nvme_device)
    if users:
        raise DiskRefused(
            f"{boot.nvme_device} is the disk of running domain(s) {', '.join(users)}",
            code=host_codes.DISK_IN_USE_BY_DOMAIN,
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
    v = require_vm(vm, action)
    ctx.drivers.domains.define(ctx.xml(v))
    ctx.drivers.domains.start(v.name)
    if ctx.drivers.network is not None and ctx.settings.manage_network:
        ctx.drivers.network.isolate_ports(ctx.plan.network)  # the new tap forwards to no other VM
    return {}


def readiness(ctx: Context, action: Action, vm: VmSpec | None) -> Result:
    v = require_vm(vm, action)
    if ctx.drivers.readiness is None:
        return {"readiness": "not checked (no readiness driver: libvirt test driver)"}
    boot = v.bundles[domains.boot_bundle(v)]
    expect = None
    if ctx.settings.readiness_devices:  # the guest must see one GPU per slot and each slot's fabric VF
        expect = devicereports.Expectation(len(v.bundles), sum(1 for b in v.bundles if b.fabric_vf_pci_address))
    r = ctx.drivers.readiness.wait_ready(
        boot.mac_address.lower(),
        boot.private_ip,
        ctx.settings.readiness_port,
        float(readiness_timeout(ctx.plan, v)),  # the VM's own (VM profile > SKU), else the Fleet's
        name=v.name,
        gateway=ctx.plan.network.gateway,
        expect=expect,
    )
    doc: dict[str, Any] = {"ip": r.ip, "port": r.port, "lease_s": round(r.lease_s, 3), "ready_s": round(r.ready_s, 3)}
    if r.devices is not None:
        doc.update(devices_s=round(r.devices_s or 0.0, 3), devices=r.devices)
    return {"readiness": doc}
