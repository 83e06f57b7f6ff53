"""Ingress in the pure diff: one story per row (plan + observed rules in, steps and drift out).

plan: alloc-a on slot 0 with SSH at 203.0.113.1:20000 and 8888 at :20001; alloc-r released (slot 1)
"""

from __future__ import annotations

import dataclasses

import pytest

from host_reconciler import diff
from host_reconciler.actions import DriftMode, Step
from host_reconciler.observations import HostObservation, IngressSeen
from schemas import hostplans as hp
from tests.host.test_diff import ACTIVE, PLAN, done

SSH = hp.IngressRule("alloc-a", "203.0.113.1", 20000, "10.100.0.10", 22)
EXTRA = hp.IngressRule("alloc-a", "203.0.113.1", 20001, "10.100.0.10", 8888)
OLD_R = hp.IngressRule("alloc-r", "203.0.113.1", 20002, "10.100.0.11", 22)
STRAY = hp.IngressRule("alloc-gone", "203.0.113.1", 20003, "10.100.0.12", 22)
IPLAN = dataclasses.replace(PLAN, ingress=(SSH, EXTRA))
BOTH = IngressSeen(dnat=(SSH, EXTRA), forward=(SSH, EXTRA))


def seen(**kw: object) -> IngressSeen:
    return dataclasses.replace(BOTH, **kw)  # type: ignore[arg-type]


def codes(observed: HostObservation) -> list[str]:
    return sorted(str(d.code) for d in diff.drift(IPLAN, observed) if d.code.startswith("drift.ingress"))


@pytest.mark.parametrize(
    ("story", "ingress", "expected"),
    [
        ("in place", BOTH, []),
        ("DNAT of 8888 deleted by hand", seen(dnat=(SSH,)), ["drift.ingress.missing"]),
        ("forward half gone", seen(forward=()), ["drift.ingress.missing", "drift.ingress.missing"]),
        ("chains unhooked: nothing answers", seen(hooked=False), ["drift.ingress.missing", "drift.ingress.missing"]),
        ("a rule of a gone allocation", seen(dnat=(SSH, EXTRA, STRAY)), ["drift.ingress.extra"]),
        ("a released allocation's rule: the release removes it, not drift", seen(dnat=(SSH, EXTRA, OLD_R)), []),
        (
            "a hand-made rule in our chain",
            seen(foreign=("nat -A GPUAAS-INGRESS -p tcp --dport 9 -j DNAT",)),
            ["drift.ingress.foreign"],
        ),
        ("no ingress driver on this host: not reported", None, []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_ingress_drift_of_an_active_vm(story: str, ingress: IngressSeen | None, expected: list[str]) -> None:
    assert codes(dataclasses.replace(ACTIVE, ingress=ingress)) == expected


def test_self_heal_removes_strays_before_it_installs() -> None:
    observed = dataclasses.replace(ACTIVE, ingress=seen(dnat=(SSH, STRAY), forward=(SSH, STRAY)))
    heals = [
        (a.step, a.allocation_id)
        for a in diff.diff(IPLAN, observed, mode=DriftMode.SELF_HEAL)
        if a.step in (Step.INGRESS, Step.REMOVE_STRAY_INGRESS)
    ]
    assert heals == [(Step.REMOVE_STRAY_INGRESS, "alloc-gone"), (Step.INGRESS, "alloc-a")]
    assert [a for a in diff.diff(IPLAN, observed) if a.step is Step.INGRESS] == []  # report mode: no heal


def test_the_ingress_phase_comes_before_readiness_and_only_while_unproven() -> None:
    before_ready = dataclasses.replace(
        ACTIVE,
        progress={"alloc-a": done(Step.LEASE, Step.HOST_CHECKS, Step.VFIO_CHECK, Step.IMAGE_VERIFY, Step.DISK_WRITE)},
        ingress=IngressSeen(),
    )
    steps = [a.step for a in diff.diff(IPLAN, before_ready) if a.allocation_id == "alloc-a"]
    assert steps[-2:] == [Step.INGRESS, Step.READINESS]
    placed = dataclasses.replace(before_ready, ingress=BOTH)
    assert Step.INGRESS not in [a.step for a in diff.diff(IPLAN, placed)]


def test_a_release_removes_its_rules_before_the_wipe() -> None:
    observed = HostObservation(ingress=seen(dnat=(SSH, EXTRA, OLD_R)))
    steps = [a.step for a in diff.diff(IPLAN, observed) if a.allocation_id == "alloc-r"]
    assert Step.REMOVE_INGRESS in steps and steps.index(Step.REMOVE_INGRESS) < steps.index(Step.WIPE)
    gone = HostObservation(ingress=BOTH)
    assert Step.REMOVE_INGRESS not in [a.step for a in diff.diff(IPLAN, gone) if a.allocation_id == "alloc-r"]
