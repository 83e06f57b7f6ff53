"""A host reconciler pass end to end with real parts (no guest boots here).

libvirt test driver (a node file: private per connection), loop devices,
a network namespace with the management bridge and a real dnsmasq made by
the network and DHCP drivers. Only PCI (no GPUs) and readiness (no guest)
are not real; see tests/hostnet for the readiness gate with a real client.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from host_reconciler import converging
from host_reconciler.actions import Action, DriftCode, DriftMode, Step
from host_reconciler.drivers import wiring
from host_reconciler.observations import DomainState
from schemas.hostplans import HostPlan
from schemas.states import SlotStatus
from tests.host.conftest import Lab


def converger(lab: Lab, **changes: object) -> converging.Converger:
    s = lab.settings(**changes)
    return converging.Converger(s, wiring.drivers(s))


def slot_states(result: converging.PassResult) -> dict[int, str]:
    return {s.slot_index: str(s.state) for s in result.status.slots}


def leftovers(lab: Lab, c: converging.Converger) -> dict[str, object]:
    hosts = Path(lab.settings_doc["state_dir"]) / "dnsmasq" / "hosts"
    return {
        "domains": sorted(c.drivers.domains.domains()),
        "reservations": sorted(p.name for p in hosts.iterdir()) if hosts.exists() else [],
        "leases": c.state.read_leases(),
        "seeds": sorted(c.state.read_seeds()),
    }


def test_converge_provisions_then_release_wipes_verifies_and_frees(lab: Lab) -> None:
    c = converger(lab)
    one, two = lab.vm("alloc-1", (0,)), lab.vm("alloc-2", (2, 3), vcpus=4, memory_mib=2048)
    try:
        r = c.converge(lab.plan(1, vms=(one, two)))
        assert not r.errors, r.errors
        assert r.status.converged and r.status.observed_generation == 1
        assert slot_states(r) == {0: "active", 1: "available", 2: "active", 3: "active"}
        vm1 = next(v for v in r.status.vms if v.allocation_id == "alloc-1")
        assert set(vm1.phase_timings) == {
            str(s)
            for s in (
                Step.LEASE,
                Step.HOST_CHECKS,
                Step.VFIO_CHECK,
                Step.IMAGE_FETCH,
                Step.IMAGE_VERIFY,
                Step.CLOUD_INIT_SEED,
                Step.DHCP_RESERVATION,
                Step.DISK_WRITE,
                Step.DEFINE_START,
                Step.READINESS,
            )
        }
        assert lab.slot_disks[0].backing.read_bytes()[:12] == lab.image.read_bytes()[:12]
        assert leftovers(lab, c) == {
            "domains": ["gpuaas-alloc-1", "gpuaas-alloc-2"],
            "reservations": ["gpuaas-alloc-1", "gpuaas-alloc-2"],
            "leases": {0: "alloc-1", 2: "alloc-2", 3: "alloc-2"},
            "seeds": ["gpuaas-alloc-1", "gpuaas-alloc-2"],
        }
        hosts = Path(lab.settings_doc["state_dir"]) / "dnsmasq" / "hosts"
        assert (hosts / "gpuaas-alloc-1").read_text() == "52:54:00:aa:00:00,10.100.0.10,gpuaas-alloc-1\n"
        assert c.converge(lab.plan(1, vms=(one, two))).planned == ()  # idempotent

        r = c.converge(lab.plan(2, vms=(one,), releases=(two,)))
        assert not r.errors, r.errors
        assert slot_states(r) == {0: "active", 1: "available", 2: "available", 3: "available"}
        for slot in (2, 3):
            rep = next(s for s in r.status.slots if s.slot_index == slot)
            assert rep.wipe_state == "verified" and rep.wipe_allocation_id == "alloc-2"
            ev = rep.wipe_evidence
            assert ev["device"] == lab.slot_disks[slot].by_id and ev["signature_clear"] and ev["sampled_zero"]
        rel = next(v for v in r.status.vms if v.allocation_id == "alloc-2")
        assert rel.state == "released" and not rel.hard_stopped
        assert leftovers(lab, c) == {
            "domains": ["gpuaas-alloc-1"],
            "reservations": ["gpuaas-alloc-1"],
            "leases": {0: "alloc-1"},
            "seeds": ["gpuaas-alloc-1"],
        }
    finally:
        c.drivers.close()


def test_dry_run_changes_nothing(lab: Lab) -> None:
    c = converger(lab)
    try:
        r = c.converge(lab.plan(1, vms=(lab.vm("alloc-1", (0,)),)), dry_run=True)
        assert [str(a.step) for a in r.planned][:3] == ["lease", "host_checks", "vfio_check"]
        assert r.executed == ()
        assert leftovers(lab, c) == {"domains": [], "reservations": [], "leases": {}, "seeds": []}
        assert b"GPUAASLAB" not in lab.slot_disks[0].backing.read_bytes()[:64]
    finally:
        c.drivers.close()


def test_failed_wipe_blocks_only_that_slot(lab: Lab) -> None:
    c = converger(lab)
    vm = lab.vm("alloc-2", (2, 3), vcpus=4, memory_mib=2048)
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        lab.loops.mount(lab.slot_disks[3])  # someone mounted slot 3's (data) disk on the host
        r = c.converge(lab.plan(2, releases=(vm,)))
        assert slot_states(r)[3] == str(SlotStatus.CLEANUP_BLOCKED)
        assert slot_states(r)[2] == str(SlotStatus.AVAILABLE)
        blocked = next(s for s in r.status.slots if s.slot_index == 3)
        assert blocked.wipe_state == "failed" and "host.disk.mounted" in (blocked.wipe_error or "")
        assert c.state.read_leases() == {3: "alloc-2"}  # the blocked slot keeps its lease
        # The next pass leaves the blocked slot alone; the rest stays converged.
        again = c.converge(lab.plan(2, releases=(vm,)))
        assert again.planned == () and slot_states(again)[3] == str(SlotStatus.CLEANUP_BLOCKED)
    finally:
        c.drivers.close()


def test_failed_wipe_verification_blocks_only_that_slot(lab: Lab) -> None:
    vm = lab.vm("alloc-2", (2, 3), vcpus=4, memory_mib=2048)

    def scribble(action: Action, when: str) -> None:  # a signature appears between wipe and verify
        if action.step is Step.WIPE and action.slot_indexes == (3,) and when == "done":
            subprocess.run(["mkfs.ext4", "-q", lab.slot_disks[3].device], check=True)

    s = lab.settings()
    c = converging.Converger(s, wiring.drivers(s), on_step=scribble)
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        r = c.converge(lab.plan(2, releases=(vm,)))
        assert slot_states(r) == {0: "available", 1: "available", 2: "available", 3: "cleanup_blocked"}
        bad = next(s for s in r.status.slots if s.slot_index == 3)
        assert bad.wipe_state == "failed" and bad.wipe_evidence["signature_clear"] is False
    finally:
        c.drivers.close()


class StubbornDomains:
    """The real libvirt driver, but the guest ignores ACPI shutdown (the test driver obeys at once)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.shutdowns = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def shutdown(self, name: str) -> None:
        self.shutdowns += 1


def test_graceful_stop_then_hard_stop_after_the_timeout(lab: Lab) -> None:
    s = lab.settings()
    drivers = wiring.drivers(s)
    stubborn = StubbornDomains(drivers.domains)
    drivers.domains = stubborn  # type: ignore[assignment]
    c = converging.Converger(s, drivers)
    vm = lab.vm("alloc-1", (0,))
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        r = c.converge(lab.plan(2, releases=(vm,), shutdown_timeout_s=1))
        assert not r.errors, r.errors
        assert stubborn.shutdowns == 1
        rel = next(v for v in r.status.vms if v.allocation_id == "alloc-1")
        assert rel.hard_stopped and rel.state == "released"
        graceful = next(ms for a, ms in r.executed if a.step is Step.GRACEFUL_STOP)
        assert graceful >= 1000
    finally:
        drivers.close()


def test_drift_is_reported_then_healed_in_self_heal_mode(lab: Lab) -> None:
    c = converger(lab)
    vm = lab.vm("alloc-1", (0,))
    plan = lab.plan(1, vms=(vm,))
    try:
        assert not c.converge(plan).errors
        hosts = Path(lab.settings_doc["state_dir"]) / "dnsmasq" / "hosts"
        (hosts / "gpuaas-alloc-1").unlink()
        c.drivers.domains.destroy("gpuaas-alloc-1")
        lab.loops.mount(lab.slot_disks[1])  # a free slot's disk mounted on the host
        r = c.converge(plan)  # report-only (the default) changes nothing
        found = {(d.slot_index, d.code) for d in r.status.drift}
        assert {
            (0, DriftCode.RESERVATION_MISSING),
            (0, DriftCode.DOMAIN_NOT_RUNNING),
            (1, DriftCode.DISK_MOUNTED),
        } <= found
        assert r.executed == ()
        free = next(s for s in r.status.slots if s.slot_index == 1)
        assert not free.schedulable
        healed = c.converge(plan, mode=DriftMode.SELF_HEAL)
        assert [str(a.step) for a, _ in healed.executed] == ["dhcp_reservation", "start_domain"]
        assert {d.code for d in healed.status.drift} == {DriftCode.DISK_MOUNTED}  # disks are never "healed"
        assert c.drivers.domains.state("gpuaas-alloc-1") is DomainState.RUNNING
    finally:
        c.drivers.close()


def test_permanent_failure_fails_the_vm_until_a_new_generation(lab: Lab) -> None:
    c = converger(lab)
    bad = dataclasses.replace(
        lab.vm("alloc-1", (0,)), image=dataclasses.replace(lab.vm("alloc-1", (0,)).image, digest_sha256="0" * 64)
    )  # type: ignore[arg-type]
    try:
        r = c.converge(lab.plan(1, vms=(bad,)))
        assert [e.code for e in r.errors] == ["host.image.digest_mismatch"]
        assert slot_states(r)[0] == "failed"
        assert b"GPUAASLAB" not in lab.slot_disks[0].backing.read_bytes()[:64]  # nothing written
        assert c.converge(lab.plan(1, vms=(bad,))).planned == ()  # failed at generation 1: left alone
        retry = c.converge(lab.plan(2, vms=(bad,)))
        # A new generation retries from the failed phase (the phases before it stay proven): the
        # staged file is hashed while it is copied into the cache, so the fetch is what fails.
        assert str(retry.planned[0].step) == "image_fetch"
        assert [e.code for e in retry.errors] == ["host.image.digest_mismatch"]
        cache = Path(lab.settings_doc["image_dir"])
        assert list((cache / "sha256").iterdir()) == [] and list((cache / "partial").iterdir()) == []
    finally:
        c.drivers.close()


def test_orphans_are_reported_and_removed_only_in_self_heal(lab: Lab) -> None:
    c = converger(lab)
    vm = lab.vm("alloc-1", (0,))
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        empty: HostPlan = lab.plan(2)  # the plan dropped the VM without a release (a central bug)
        r = c.converge(empty)
        assert {d.code for d in r.status.drift} >= {
            DriftCode.DOMAIN_UNEXPECTED,
            DriftCode.RESERVATION_STALE,
            DriftCode.SEED_ORPHAN,
            DriftCode.LEASE_ORPHAN,
        }
        assert leftovers(lab, c)["domains"] == ["gpuaas-alloc-1"]
        c.converge(empty, mode=DriftMode.SELF_HEAL)
        assert leftovers(lab, c) == {"domains": [], "reservations": [], "leases": {}, "seeds": []}
        assert b"GPUAASLAB" in lab.slot_disks[0].backing.read_bytes()[:64]  # self-heal never wipes
    finally:
        c.drivers.close()
