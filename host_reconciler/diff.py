"""`diff(host_plan, observed) -> [Action]` and `drift(host_plan, observed) -> [Drift]`.

Pure: no file, socket or process is touched here; every fact comes in
through `HostObservation`, so every rule below is tested on values alone. The rules:

- a VM of the plan gets the provision phases whose completion observation
  cannot prove; a phase before a proven later one is done (a defined domain
  proves its disk was written: the disk is never written twice);
- a VM that passed readiness once is no longer provisioned: what diverges
  after that is drift, healed only in self-heal mode;
- a release gets the release phases still unproven, per slot for wipe,
  verify and report-free, so a blocked slot stops only itself;
- drift is reported per slot in both modes; self-heal adds the heal steps;
- a slot whose disk guard refused the disk's identity (a blocked wipe
  record with identity evidence, written by the phase that met it) reports
  `drift.identity.changed` until an operator clears the block: the by-id path
  no longer leads to the approved disk, and only a person (or git) decides
  which disk is right.

Ordering: releases first (they free leases and disks), then provisions, then
heals.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from host_reconciler import domains, ingresses
from host_reconciler.actions import (
    PROVISION_STEPS,
    Action,
    Drift,
    DriftCode,
    DriftMode,
    Flow,
    Step,
)
from host_reconciler.observations import DomainObs, HostObservation, Progress, WipeRecord
from schemas.hostplans import HostPlan, SlotBundle, VmSpec

VFIO_DRIVER = "vfio-pci"


def diff(
    plan: HostPlan,
    observed: HostObservation,
    *,
    options: domains.DomainOptions | None = None,
    mode: DriftMode = DriftMode.REPORT,
) -> list[Action]:
    opts = options or domains.DomainOptions()
    actions: list[Action] = []
    for vm in plan.releases:
        actions.extend(_release(vm, observed))
    for vm in plan.vms:
        actions.extend(_provision(plan, vm, observed, opts))
    if mode is DriftMode.SELF_HEAL:
        actions.extend(_heals(drift(plan, observed, options=opts)))
    return actions


def _progress(vm: VmSpec, digest: str, observed: HostObservation) -> Progress | None:
    """The journal of `vm` if it was written for this spec (a new spec starts over)."""
    prog = observed.progress.get(vm.allocation_id)
    return prog if prog is not None and prog.spec_digest == digest else None


def was_active(vm: VmSpec, observed: HostObservation) -> bool:
    """Passed readiness once, whatever spec it had then: from here on, divergence is drift."""
    prog = observed.progress.get(vm.allocation_id)
    return prog is not None and Step.READINESS in prog.done


def _provision(plan: HostPlan, vm: VmSpec, observed: HostObservation, options: domains.DomainOptions) -> list[Action]:
    if was_active(vm, observed):
        return []  # a running tenant VM is never provisioned again; see drift
    digest = domains.spec_digest(vm, plan.network, options)
    prog = _progress(vm, digest, observed)
    done = set(prog.done) if prog else set()
    if prog is not None and prog.failed is not None and prog.failed.generation == plan.generation:
        return []  # failed for good at this generation; a new plan generation retries
    dom = observed.domains.get(vm.name)
    defined = dom is not None and dom.facts.spec_digest == digest
    running = defined and dom is not None and dom.running
    slots = tuple(sorted(b.slot_index for b in vm.bundles))
    boot = vm.bundles[domains.boot_bundle(vm)] if vm.bundles else None
    res = observed.reservations.get(vm.name)
    proven = {
        Step.LEASE: all(observed.leases.get(s) == vm.allocation_id for s in slots),
        Step.HOST_CHECKS: Step.HOST_CHECKS in done or defined,
        Step.VFIO_CHECK: Step.VFIO_CHECK in done or defined,
        # In the cache (whoever fetched it), or no longer needed: the disk is written. A cached
        # image that went away before the disk write is fetched again.
        Step.IMAGE_FETCH: vm.image is None
        or (vm.image.digest_sha256 or "") in observed.images
        or Step.DISK_WRITE in done
        or dom is not None,
        Step.IMAGE_VERIFY: Step.IMAGE_VERIFY in done or dom is not None,
        Step.CLOUD_INIT_SEED: observed.seeds.get(vm.name) == domains.seed_digest(vm),
        Step.DHCP_RESERVATION: boot is not None
        and res is not None
        and (res.mac, res.ip) == (boot.mac_address.lower(), boot.private_ip),
        # Any domain of this VM (even of an older spec) was defined after its disk was written.
        Step.DISK_WRITE: Step.DISK_WRITE in done or dom is not None,
        Step.DEFINE_START: running,
        Step.INGRESS: ingresses.provisioned(plan, vm, observed),
        Step.READINESS: False,
    }
    return [
        Action(Flow.PROVISION, step, vm.allocation_id, slots, reason=f"provision {vm.name}")
        for step in PROVISION_STEPS
        if not proven[step]
    ]


def _release(vm: VmSpec, observed: HostObservation) -> list[Action]:
    alloc = vm.allocation_id
    dom = observed.domains.get(vm.name)
    slots = tuple(sorted(b.slot_index for b in vm.bundles))
    out: list[Action] = []

    def add(step: Step, slot_indexes: tuple[int, ...] = slots) -> None:
        out.append(Action(Flow.RELEASE, step, alloc, slot_indexes, reason=f"release {vm.name}"))

    if dom is not None and dom.running:
        add(Step.GRACEFUL_STOP)
        add(Step.HARD_STOP)
    if dom is not None:
        add(Step.UNDEFINE)
    if vm.name in observed.reservations or vm.name in observed.seeds:
        add(Step.REMOVE_RESERVATION)
    if ingresses.left_behind(vm, observed):
        add(Step.REMOVE_INGRESS)
    for s in slots:
        holder = observed.leases.get(s)
        if holder is not None and holder != alloc:
            continue  # another allocation holds this slot: its disk is not ours to wipe
        w = observed.wipes.get(s)
        mine = w if w is not None and w.allocation_id == alloc else None
        if mine is not None and mine.blocked:
            continue  # cleanup_blocked: only an operator clears it
        if mine is None or not mine.wiped:
            add(Step.WIPE, (s,))
        if mine is None or not mine.verified:
            add(Step.VERIFY, (s,))
        if holder == alloc and (mine is None or not mine.healthy):  # devices a VM of ours held: prove them
            add(Step.SLOT_HEALTH, (s,))
        if holder == alloc:
            add(Step.REPORT_FREE, (s,))
    return out


def drift(plan: HostPlan, observed: HostObservation, *, options: domains.DomainOptions | None = None) -> list[Drift]:
    opts = options or domains.DomainOptions()
    out: list[Drift] = []
    for vm in plan.vms:
        out.extend(_vm_drift(plan, vm, observed, opts))
    out.extend(_orphans(plan, observed))
    for bundle in plan.slots:
        out.extend(_slot_drift(plan, bundle, observed))
    for g in observed.gate:
        out.append(
            Drift(
                DriftCode.IDENTITY_CHANGED,
                g.slot_index,
                f"{g.code}: {g.message}",
                expected=g.expected,
                observed=g.observed,
            )
        )
    for problem in observed.network:
        out.append(Drift(DriftCode.NETWORK, None, problem))
    out.extend(ingresses.drift(plan, observed, (vm for vm in plan.vms if was_active(vm, observed))))
    return out


def _orphans(plan: HostPlan, observed: HostObservation) -> Iterable[Drift]:
    """Domains, reservations, seeds and leases that belong to no plan entry."""
    planned = {vm.name for vm in (*plan.vms, *plan.releases)}
    allocations = {vm.allocation_id for vm in (*plan.vms, *plan.releases)}
    for name, dom in sorted(observed.domains.items()):
        if name in planned:
            continue
        for slot in dom.facts.slot_indexes or (None,):
            yield Drift(
                DriftCode.DOMAIN_UNEXPECTED,
                slot,
                f"domain {name} ({dom.state}) is in no plan entry of this node",
                allocation_id=dom.facts.allocation_id,
                observed=name,
                heal=Step.REMOVE_ORPHAN_DOMAIN,
                subject=name,
            )
    for name, res in sorted(observed.reservations.items()):
        if name not in planned:
            yield Drift(
                DriftCode.RESERVATION_STALE,
                None,
                f"DHCP reservation {name} ({res.mac} -> {res.ip}) belongs to no planned VM",
                observed=f"{res.mac},{res.ip}",
                heal=Step.REMOVE_STALE_RESERVATION,
                subject=name,
            )
    for name in sorted(observed.seeds):
        if name not in planned:
            yield Drift(
                DriftCode.SEED_ORPHAN,
                None,
                f"cloud-init seed of {name} belongs to no plan entry",
                observed=name,
                heal=Step.REMOVE_ORPHAN_SEED,
                subject=name,
            )
    for slot, holder in sorted(observed.leases.items()):
        if holder not in allocations:
            yield Drift(
                DriftCode.LEASE_ORPHAN,
                slot,
                f"slot {slot} is leased to {holder}, which is in no plan entry",
                allocation_id=holder,
                observed=holder,
                heal=Step.REMOVE_ORPHAN_LEASE,
            )


def _slot_drift(plan: HostPlan, bundle: SlotBundle, observed: HostObservation) -> Iterable[Drift]:
    """An approved slot's disk and PCI devices, whoever holds the slot."""
    s = bundle.slot_index
    disk = observed.disks.get(s)
    busy = {b.slot_index for vm in (*plan.vms, *plan.releases) for b in vm.bundles}
    if disk is not None:
        if not disk.present:
            yield Drift(
                DriftCode.DISK_MISSING,
                s,
                f"slot {s} disk {disk.device} is not present",
                expected=disk.device,
            )
        if disk.os_disk:
            yield Drift(
                DriftCode.DISK_OS,
                s,
                f"slot {s} disk {disk.device} is the OS disk",
                observed=disk.device,
            )
        if disk.mounted:
            yield Drift(
                DriftCode.DISK_MOUNTED,
                s,
                f"slot {s} disk {disk.device} is mounted at {', '.join(disk.mounted)}",
                observed=",".join(disk.mounted),
            )
        free = s not in busy and s not in observed.leases
        if free and disk.signatures:
            yield Drift(
                DriftCode.DISK_SIGNATURE,
                s,
                f"free slot {s} disk {disk.device} carries {', '.join(disk.signatures)}",
                expected="no signature",
                observed=",".join(disk.signatures),
            )
    refused = identity_refusal(observed.wipes.get(s))
    if refused is not None:
        rec = observed.wipes[s]
        differs = [str(f) for f in refused.get("differs") or ()]
        yield Drift(
            DriftCode.IDENTITY_CHANGED,
            s,
            rec.blocked or f"slot {s} disk identity changed",
            allocation_id=rec.allocation_id,
            expected=_fields(refused.get("approved"), differs),
            observed=_fields(refused.get("observed"), differs),
        )
    for role, address in (("GPU", bundle.gpu_pci_address), ("VF", bundle.fabric_vf_pci_address)):
        dev = observed.pci.get(address) if address else None
        if dev is None:
            continue
        if not dev.present:
            yield Drift(
                DriftCode.PCI_MISSING,
                s,
                f"slot {s} {role} {address} is not on the PCI bus",
                expected=address,
            )
        elif dev.driver != VFIO_DRIVER:
            yield Drift(
                DriftCode.PCI_NOT_VFIO,
                s,
                f"slot {s} {role} {address} is bound to {dev.driver or 'no driver'}",
                expected=VFIO_DRIVER,
                observed=dev.driver or "none",
            )


def identity_refusal(rec: WipeRecord | None) -> Mapping[str, Any] | None:
    """The identity evidence of a slot blocked because its disk is not the approved one, else None."""
    if rec is None or not rec.blocked:
        return None
    for step_evidence in rec.evidence.values():
        found = step_evidence.get("identity") if isinstance(step_evidence, Mapping) else None
        if isinstance(found, Mapping):
            return found
    return None


def _fields(identity: object, names: list[str]) -> str | None:
    if not isinstance(identity, Mapping):
        return None
    return " ".join(f"{n}={identity.get(n)}" for n in names) or None


def _vm_drift(plan: HostPlan, vm: VmSpec, observed: HostObservation, options: domains.DomainOptions) -> Iterable[Drift]:
    if not was_active(vm, observed):
        return  # still provisioning: missing pieces are phases, not drift
    digest = domains.spec_digest(vm, plan.network, options)
    alloc = vm.allocation_id
    boot = vm.bundles[domains.boot_bundle(vm)]
    dom = observed.domains.get(vm.name)
    if dom is None:
        yield Drift(
            DriftCode.DOMAIN_MISSING,
            boot.slot_index,
            f"domain {vm.name} of active allocation {alloc} is gone",
            allocation_id=alloc,
            expected=vm.name,
            heal=Step.DEFINE_START,
        )
    else:
        yield from _domain_drift(plan, vm, dom, digest)
    res = observed.reservations.get(vm.name)
    want = f"{boot.mac_address.lower()},{boot.private_ip}"
    if res is None:
        yield Drift(
            DriftCode.RESERVATION_MISSING,
            boot.slot_index,
            f"DHCP reservation of {vm.name} is missing",
            allocation_id=alloc,
            expected=want,
            heal=Step.DHCP_RESERVATION,
        )
    elif f"{res.mac},{res.ip}" != want:
        yield Drift(
            DriftCode.RESERVATION_STALE,
            boot.slot_index,
            f"DHCP reservation of {vm.name} is stale",
            allocation_id=alloc,
            expected=want,
            observed=f"{res.mac},{res.ip}",
            heal=Step.DHCP_RESERVATION,
        )
    for b in vm.bundles:
        holder = observed.leases.get(b.slot_index)
        if holder != alloc:
            yield Drift(
                DriftCode.LEASE_MISSING,
                b.slot_index,
                f"slot {b.slot_index} lease of {alloc} is missing",
                allocation_id=alloc,
                expected=alloc,
                observed=holder,
                heal=Step.LEASE,
            )
    if observed.seeds.get(vm.name) != domains.seed_digest(vm):
        yield Drift(
            DriftCode.SEED_MISSING,
            boot.slot_index,
            f"cloud-init seed of {vm.name} is missing or stale",
            allocation_id=alloc,
            expected=domains.seed_digest(vm),
            observed=observed.seeds.get(vm.name),
            heal=Step.CLOUD_INIT_SEED,
        )


def _domain_drift(plan: HostPlan, vm: VmSpec, dom: DomainObs, digest: str) -> Iterable[Drift]:
    alloc = vm.allocation_id
    first = vm.bundles[domains.boot_bundle(vm)].slot_index
    if not dom.running:
        yield Drift(
            DriftCode.DOMAIN_NOT_RUNNING,
            first,
            f"domain {vm.name} is {dom.state}",
            allocation_id=alloc,
            expected="running",
            observed=str(dom.state),
            heal=Step.START_DOMAIN,
        )
    want = domains.expected_facts(vm, plan.network)
    got = dom.facts
    for label, exp, obs in (
        ("hostdevs", want.hostdevs, got.hostdevs),
        ("disks", want.disks, got.disks),
        ("MAC", want.macs, got.macs),
        ("bridge", want.bridges, got.bridges),
    ):
        if tuple(exp) != tuple(obs):
            yield Drift(
                DriftCode.DOMAIN_DEVICES,
                first,
                f"domain {vm.name} {label} differ from its slots",
                allocation_id=alloc,
                expected=",".join(exp),
                observed=",".join(obs),
                heal=Step.REDEFINE_DOMAIN,
            )
    for label, bad in (
        ("graphics", got.graphics),
        ("TPM", got.tpm),
        ("secure boot", got.secure_boot),
    ):
        if bad:
            yield Drift(
                DriftCode.DOMAIN_DEVICES,
                first,
                f"domain {vm.name} has {label}",
                allocation_id=alloc,
                expected=f"no {label}",
                observed=label,
                heal=Step.REDEFINE_DOMAIN,
            )
    if got.spec_digest != digest:
        yield Drift(
            DriftCode.DOMAIN_SPEC_CHANGED,
            first,
            f"domain {vm.name} was defined from another spec",
            allocation_id=alloc,
            expected=digest,
            observed=got.spec_digest or "none",
            heal=Step.REDEFINE_DOMAIN,
        )


_HEAL_ORDER = {
    Step.REMOVE_ORPHAN_DOMAIN: 0,
    Step.REMOVE_STALE_RESERVATION: 1,
    Step.REMOVE_ORPHAN_SEED: 2,
    Step.REMOVE_ORPHAN_LEASE: 3,
    Step.LEASE: 4,
    Step.CLOUD_INIT_SEED: 5,
    Step.DHCP_RESERVATION: 6,
    Step.DEFINE_START: 7,
    Step.REDEFINE_DOMAIN: 8,
    Step.START_DOMAIN: 9,
    Step.REMOVE_STRAY_INGRESS: 10,  # a stray rule may hold the port a missing one needs
    Step.INGRESS: 11,
}


def _heals(found: Iterable[Drift]) -> list[Action]:
    seen: set[tuple[Step, str, str]] = set()
    out: list[Action] = []
    for d in found:
        if d.heal is None:
            continue
        alloc = d.allocation_id or ""
        target = d.subject or ""
        slots = (d.slot_index,) if d.heal is Step.REMOVE_ORPHAN_LEASE and d.slot_index is not None else ()
        key = (d.heal, alloc, target or str(slots))
        if key in seen:
            continue
        seen.add(key)
        out.append(Action(Flow.HEAL, d.heal, alloc, slots, target=target, reason=str(d.code)))
    # a domain that must be redefined or restarted waits for its reservation and seed
    return sorted(out, key=lambda a: _HEAL_ORDER.get(a.step, 99))
