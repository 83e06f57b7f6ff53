"""diff and drift are pure: plan + observed in, actions and drift out. No drivers, no mocks.

node: slots 0,1 (NUMA 0), 2 (NUMA 1)
plan: alloc-a on slot 0 (provision), alloc-r on slot 1 (release), slot 2 free
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from host_reconciler import diff, domains, imagecache
from host_reconciler.actions import PROVISION_STEPS, DriftCode, DriftMode, Flow, Step
from host_reconciler.observations import (
    DiskObs,
    DomainObs,
    DomainState,
    Failure,
    GateFinding,
    HostObservation,
    PciObs,
    PhaseRecord,
    Progress,
    ReservationObs,
    WipeRecord,
)
from schemas import hostplans as hp

NET = hp.Network("10.100.0.0/24", "10.100.0.1", "10.100.0.10", "10.100.0.250", "gpuaasbr0")
OPTS = domains.DomainOptions(domain_type="test")


def bundle(i: int, numa: int = 0) -> hp.SlotBundle:
    return hp.SlotBundle(
        i,
        f"0000:{0x1B + i:02x}:00.0",
        f"0000:{0x1A + i:02x}:00.1",
        f"/dev/disk/by-id/nvme-S{i}",
        f"52:54:00:00:00:{i:02x}",
        f"10.100.0.{10 + i}",
        numa,
    )


VM_A = hp.VmSpec("alloc-a", "t", (bundle(0),), vcpu_count=2, memory_mib=1024)
VM_R = hp.VmSpec("alloc-r", "t", (bundle(1),), vcpu_count=2, memory_mib=1024)
PLAN = hp.HostPlan(
    "n",
    3,
    NET,
    "/dev/disk/by-id/nvme-OS",
    vms=(VM_A,),
    releases=(VM_R,),
    slots=(bundle(0), bundle(1), bundle(2, numa=1)),
)
DIGEST_A = domains.spec_digest(VM_A, NET, OPTS)
SEED_A = domains.seed_digest(VM_A)


def dom(
    vm: hp.VmSpec, state: DomainState = DomainState.RUNNING, digest: str | None = None, **facts: object
) -> DomainObs:
    want = domains.expected_facts(vm, NET)
    return DomainObs(
        domains.DomainFacts(
            **{
                **{
                    k: getattr(want, k)
                    for k in ("name", "uuid", "allocation_id", "slot_indexes", "hostdevs", "disks", "macs", "bridges")
                },
                "spec_digest": digest if digest is not None else domains.spec_digest(vm, NET, OPTS),
                **facts,
            }
        ),
        state,
    )


def done(*steps: Step) -> Progress:
    return Progress("alloc-a", DIGEST_A, MappingProxyType({str(s): PhaseRecord(1.0, "t") for s in steps}))


def replace_obs(obs: HostObservation, **changes: object) -> HostObservation:
    return dataclasses.replace(obs, **changes)  # type: ignore[arg-type]


RES_A = ReservationObs("gpuaas-alloc-a", "52:54:00:00:00:00", "10.100.0.10")
ACTIVE = HostObservation(
    domains={"gpuaas-alloc-a": dom(VM_A)},
    reservations={"gpuaas-alloc-a": RES_A},
    leases={0: "alloc-a"},
    seeds={"gpuaas-alloc-a": SEED_A},
    progress={"alloc-a": done(*PROVISION_STEPS)},
    wipes={1: WipeRecord(1, "alloc-r", wiped=True, verified=True)},
)


def steps(actions: list, alloc: str | None = None) -> list[str]:
    return [str(a.step) for a in actions if alloc is None or a.allocation_id == alloc]


@pytest.mark.parametrize(
    ("story", "observed", "expected"),
    [
        (
            "nothing there yet: every phase (no image: nothing to fetch, no endpoint to open)",
            HostObservation(),
            [str(s) for s in PROVISION_STEPS if s not in (Step.IMAGE_FETCH, Step.INGRESS)],
        ),
        (
            "killed after the reservation: lease, seed, reservation proven",
            HostObservation(
                leases={0: "alloc-a"},
                seeds={"gpuaas-alloc-a": SEED_A},
                reservations={"gpuaas-alloc-a": RES_A},
                progress={"alloc-a": done(Step.LEASE)},
            ),
            ["host_checks", "vfio_check", "image_verify", "disk_write", "define_start", "readiness"],
        ),
        (
            "defined but not started: the disk is never written again",
            HostObservation(
                leases={0: "alloc-a"},
                seeds={"gpuaas-alloc-a": SEED_A},
                reservations={"gpuaas-alloc-a": RES_A},
                domains={"gpuaas-alloc-a": dom(VM_A, DomainState.SHUTOFF)},
            ),
            ["define_start", "readiness"],
        ),
        (
            "running, killed during readiness",
            replace_obs(ACTIVE, progress={"alloc-a": done(*[s for s in PROVISION_STEPS if s is not Step.READINESS])}),
            ["readiness"],
        ),
        ("active: nothing to do", ACTIVE, []),
        (
            "stale reservation (other IP) is re-done while provisioning",
            HostObservation(
                leases={0: "alloc-a"},
                seeds={"gpuaas-alloc-a": SEED_A},
                reservations={"gpuaas-alloc-a": ReservationObs("gpuaas-alloc-a", RES_A.mac, "10.100.0.99")},
                domains={"gpuaas-alloc-a": dom(VM_A)},
            ),
            ["dhcp_reservation", "readiness"],
        ),
        (
            "failed at this generation: left alone",
            HostObservation(
                progress={
                    "alloc-a": Progress("alloc-a", DIGEST_A, MappingProxyType({}), Failure("image_verify", "x", "y", 3))
                }
            ),
            [],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_provision_phases(story: str, observed: HostObservation, expected: list[str]) -> None:
    assert steps(diff.diff(PLAN, observed, options=OPTS), "alloc-a") == expected


IMAGE_HEX = "ab" * 32
VM_I = dataclasses.replace(VM_A, image=hp.ImageRef("img", "images/img.qcow2", IMAGE_HEX, "qcow2"))
PLAN_I = dataclasses.replace(PLAN, vms=(VM_I,))
DIGEST_I = domains.spec_digest(VM_I, NET, OPTS)


def _cached(hexd: str) -> dict[str, imagecache.CacheEntry]:
    return {hexd: imagecache.CacheEntry(hexd, f"/c/sha256/{hexd}", 10, 0.0)}


@pytest.mark.parametrize(
    ("story", "observed", "fetch"),
    [
        ("not cached: fetched before it is verified", HostObservation(), True),
        ("in the cache (whoever fetched it): no fetch", HostObservation(images=_cached(IMAGE_HEX)), False),
        ("another image cached: fetched", HostObservation(images=_cached("cd" * 32)), True),
        (
            "disk written, image evicted since: not fetched again",
            HostObservation(
                progress={
                    "alloc-a": Progress(
                        "alloc-a",
                        DIGEST_I,
                        MappingProxyType(
                            {
                                str(s): PhaseRecord(1.0, "t")
                                for s in PROVISION_STEPS[: PROVISION_STEPS.index(Step.DISK_WRITE) + 1]
                            }
                        ),
                    )
                }
            ),
            False,
        ),
        (
            "fetched once, evicted before the disk write: fetched again",
            HostObservation(
                progress={
                    "alloc-a": Progress(
                        "alloc-a",
                        DIGEST_I,
                        MappingProxyType({str(s): PhaseRecord(1.0, "t") for s in (Step.LEASE, Step.IMAGE_FETCH)}),
                    )
                }
            ),
            True,
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_image_fetch_phase(story: str, observed: HostObservation, fetch: bool) -> None:
    got = steps(diff.diff(PLAN_I, observed, options=OPTS), "alloc-a")
    assert ("image_fetch" in got) is fetch
    if fetch:  # before the digest check and the disk write
        assert got.index("image_fetch") < got.index("image_verify") < got.index("disk_write")


def test_failed_at_an_older_generation_is_retried() -> None:
    obs = HostObservation(
        progress={"alloc-a": Progress("alloc-a", DIGEST_A, MappingProxyType({}), Failure("image_verify", "x", "y", 2))}
    )
    assert steps(diff.diff(PLAN, obs, options=OPTS), "alloc-a")[0] == "lease"


def test_changed_spec_restarts_the_journal() -> None:
    before_ready = [s for s in PROVISION_STEPS if s is not Step.READINESS]
    other = Progress("alloc-a", "0" * 32, MappingProxyType({str(s): PhaseRecord(1, "t") for s in before_ready}))
    assert steps(diff.diff(PLAN, HostObservation(progress={"alloc-a": other}), options=OPTS), "alloc-a")[:2] == [
        "lease",
        "host_checks",
    ]


@pytest.mark.parametrize(
    ("story", "observed", "expected"),
    [
        (
            "running domain: the whole release",
            HostObservation(
                domains={"gpuaas-alloc-r": dom(VM_R)},
                leases={1: "alloc-r"},
                reservations={"gpuaas-alloc-r": ReservationObs("gpuaas-alloc-r", "52:54:00:00:00:01", "10.100.0.11")},
                seeds={"gpuaas-alloc-r": "x"},
            ),
            [
                "graceful_stop",
                "hard_stop",
                "undefine",
                "remove_reservation",
                "wipe",
                "verify",
                "slot_health",
                "report_free",
            ],
        ),
        (
            "killed after undefine",
            HostObservation(leases={1: "alloc-r"}, seeds={"gpuaas-alloc-r": "x"}),
            ["remove_reservation", "wipe", "verify", "slot_health", "report_free"],
        ),
        (
            "wiped, not verified",
            HostObservation(leases={1: "alloc-r"}, wipes={1: WipeRecord(1, "alloc-r", wiped=True, verified=False)}),
            ["verify", "slot_health", "report_free"],
        ),
        (
            "verified, devices not yet proven",
            HostObservation(leases={1: "alloc-r"}, wipes={1: WipeRecord(1, "alloc-r", True, True)}),
            ["slot_health", "report_free"],
        ),
        (
            "verified and healthy, lease still held",
            HostObservation(
                leases={1: "alloc-r"},
                wipes={1: WipeRecord(1, "alloc-r", True, True, evidence={"slot_health": {"ok": True}})},
            ),
            ["report_free"],
        ),
        ("done", HostObservation(wipes={1: WipeRecord(1, "alloc-r", True, True)}), []),
        (
            "cleanup blocked: left for an operator",
            HostObservation(
                leases={1: "alloc-r"}, wipes={1: WipeRecord(1, "alloc-r", True, False, blocked="verify failed")}
            ),
            [],
        ),
        (
            "evidence of an older allocation does not count",
            HostObservation(wipes={1: WipeRecord(1, "alloc-old", True, True)}),
            ["wipe", "verify"],
        ),
        ("slot held by another allocation: never wiped", HostObservation(leases={1: "alloc-new"}), []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_release_phases(story: str, observed: HostObservation, expected: list[str]) -> None:
    assert steps(diff.diff(PLAN, observed, options=OPTS), "alloc-r") == expected


def test_release_is_per_slot() -> None:
    vm = hp.VmSpec("alloc-2", "t", (bundle(1), bundle(2, numa=1)), vcpu_count=2, memory_mib=1024)
    plan = hp.HostPlan("n", 1, NET, "/dev/disk/by-id/nvme-OS", releases=(vm,), slots=PLAN.slots)
    obs = HostObservation(
        leases={1: "alloc-2", 2: "alloc-2"}, wipes={1: WipeRecord(1, "alloc-2", True, False, blocked="wipe failed")}
    )
    acts = diff.diff(plan, obs, options=OPTS)
    assert [(str(a.step), a.slot_indexes) for a in acts] == [
        ("wipe", (2,)),
        ("verify", (2,)),
        ("slot_health", (2,)),
        ("report_free", (2,)),
    ]


def codes(found: list) -> list[tuple[int | None, str]]:
    return [(d.slot_index, str(d.code)) for d in found]


@pytest.mark.parametrize(
    ("story", "changes", "expected"),
    [
        ("converged: no drift", {}, []),
        ("domain gone", {"domains": {}}, [(0, DriftCode.DOMAIN_MISSING)]),
        (
            "domain stopped",
            {"domains": {"gpuaas-alloc-a": dom(VM_A, DomainState.SHUTOFF)}},
            [(0, DriftCode.DOMAIN_NOT_RUNNING)],
        ),
        (
            "a hostdev swapped",
            {"domains": {"gpuaas-alloc-a": dom(VM_A, hostdevs=("0000:1a:00.1", "0000:ff:00.0"))}},
            [(0, DriftCode.DOMAIN_DEVICES)],
        ),
        ("reservation missing", {"reservations": {}}, [(0, DriftCode.RESERVATION_MISSING)]),
        (
            "unexpected domain",
            {
                "domains": {
                    "gpuaas-alloc-a": dom(VM_A),
                    "gpuaas-x": dom(hp.VmSpec("x", "t", (bundle(2, 1),), vcpu_count=1, memory_mib=512)),
                }
            },
            [(2, DriftCode.DOMAIN_UNEXPECTED)],
        ),
        (
            "stale reservation",
            {
                "reservations": {
                    "gpuaas-alloc-a": RES_A,
                    "gpuaas-old": ReservationObs("gpuaas-old", "52:54:00:00:00:09", "10.100.0.19"),
                }
            },
            [(None, DriftCode.RESERVATION_STALE)],
        ),
        (
            "free disk mounted and signed",
            {"disks": {2: DiskObs("/dev/disk/by-id/nvme-S2", True, ("/mnt",), ("TYPE=ext4",))}},
            [(2, DriftCode.DISK_MOUNTED), (2, DriftCode.DISK_SIGNATURE)],
        ),
        ("tenant disk signature is not drift", {"disks": {0: DiskObs("/dev/disk/by-id/nvme-S0", True, (), None)}}, []),
        (
            "VF off vfio-pci",
            {"pci": {"0000:1c:00.1": PciObs("0000:1c:00.1", True, "mlx5_core")}},
            [(2, DriftCode.PCI_NOT_VFIO)],
        ),
        (
            "discovery gate",
            {"gate": (GateFinding(2, "drift.vf_missing", "VF 0000:1c:00.1 is gone", "0000:1c:00.1", "0000:1c:00.2"),)},
            [(2, DriftCode.IDENTITY_CHANGED)],
        ),
        ("orphan lease", {"leases": {0: "alloc-a", 2: "alloc-zombie"}}, [(2, DriftCode.LEASE_ORPHAN)]),
        (
            "disk identity refused",
            {
                "wipes": {
                    1: WipeRecord(1, "alloc-r", True, True),
                    2: WipeRecord(
                        2,
                        "alloc-x",
                        False,
                        False,
                        blocked="host.disk.identity_changed: slot 2: ...",
                        evidence={
                            "wipe": {
                                "identity": {
                                    "differs": ["serial"],
                                    "approved": {"serial": "A"},
                                    "observed": {"serial": "B"},
                                }
                            }
                        },
                    ),
                }
            },
            [(2, DriftCode.IDENTITY_CHANGED)],
        ),
        (
            "a cleared identity block is no drift",
            {
                "wipes": {
                    2: WipeRecord(
                        2, "alloc-x", False, False, evidence={"host_checks": {"identity": {"differs": ["serial"]}}}
                    )
                }
            },
            [],
        ),
        (
            "another cleanup block is no identity drift",
            {
                "wipes": {
                    2: WipeRecord(
                        2, "alloc-x", True, False, blocked="host.disk.verify_failed: ...", evidence={"verify": {}}
                    )
                }
            },
            [],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_drift(story: str, changes: dict, expected: list[tuple[int | None, str]]) -> None:
    assert codes(diff.drift(PLAN, replace_obs(ACTIVE, **changes), options=OPTS)) == [(s, str(c)) for s, c in expected]


def test_identity_drift_names_the_approved_and_the_found_disk() -> None:
    rec = WipeRecord(
        2,
        "alloc-x",
        False,
        False,
        blocked="host.disk.identity_changed: slot 2: not the approved disk",
        evidence={
            "disk_write": {
                "identity": {
                    "differs": ["serial", "size_bytes"],
                    "approved": {"serial": "A", "size_bytes": 512},
                    "observed": {"serial": "B", "size_bytes": 1024},
                }
            }
        },
    )
    (found,) = diff.drift(PLAN, replace_obs(ACTIVE, wipes={2: rec}), options=OPTS)
    assert (found.code, found.slot_index, found.allocation_id) == (DriftCode.IDENTITY_CHANGED, 2, "alloc-x")
    assert (found.expected, found.observed) == ("serial=A size_bytes=512", "serial=B size_bytes=1024")
    assert found.message == rec.blocked
    assert found.heal is None  # self-heal never decides which disk is right


def test_report_mode_never_heals_self_heal_does() -> None:
    broken = replace_obs(ACTIVE, reservations={}, domains={"gpuaas-alloc-a": dom(VM_A, DomainState.SHUTOFF)})
    assert diff.diff(PLAN, broken, options=OPTS) == []
    heals = diff.diff(PLAN, broken, options=OPTS, mode=DriftMode.SELF_HEAL)
    assert [(a.flow, str(a.step)) for a in heals] == [(Flow.HEAL, "dhcp_reservation"), (Flow.HEAL, "start_domain")]


def test_self_heal_removes_orphans_but_never_wipes() -> None:
    orphan = dom(hp.VmSpec("x", "t", (bundle(2, 1),), vcpu_count=1, memory_mib=512))
    obs = replace_obs(
        ACTIVE,
        domains={"gpuaas-alloc-a": dom(VM_A), "gpuaas-x": orphan},
        disks={2: DiskObs("/dev/disk/by-id/nvme-S2", True, (), ("TYPE=ext4",))},
    )
    heals = diff.diff(PLAN, obs, options=OPTS, mode=DriftMode.SELF_HEAL)
    assert [(str(a.step), a.target) for a in heals] == [("remove_orphan_domain", "gpuaas-x")]
    assert all(a.step not in (Step.WIPE, Step.VERIFY) for a in heals)


def test_a_changed_spec_never_reprovisions_a_running_vm() -> None:
    bigger = dataclasses.replace(VM_A, vcpu_count=4)
    plan = dataclasses.replace(PLAN, vms=(bigger,))
    assert steps(diff.diff(plan, ACTIVE, options=OPTS), "alloc-a") == []  # never a disk write
    assert codes(diff.drift(plan, ACTIVE, options=OPTS)) == [(0, str(DriftCode.DOMAIN_SPEC_CHANGED))]
    heals = diff.diff(plan, ACTIVE, options=OPTS, mode=DriftMode.SELF_HEAL)
    assert [str(a.step) for a in heals] == ["redefine_domain"]


def test_a_new_image_or_key_shapes_no_domain() -> None:
    restamped = dataclasses.replace(VM_A, image=hp.ImageRef("x", "y", "f" * 64, "raw"))
    plan = dataclasses.replace(PLAN, vms=(restamped,))
    assert domains.spec_digest(restamped, NET, OPTS) == DIGEST_A
    assert codes(diff.drift(plan, ACTIVE, options=OPTS)) == []
    rekeyed = dataclasses.replace(PLAN, vms=(dataclasses.replace(VM_A, ssh_keys=("ssh-ed25519 AAAA k",)),))
    assert codes(diff.drift(rekeyed, ACTIVE, options=OPTS)) == [(0, str(DriftCode.SEED_MISSING))]
