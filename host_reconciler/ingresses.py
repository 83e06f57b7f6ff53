"""What the host plan's ingress asks of one host, against what the host shows (pure).

Called by `diff`: no file, socket or process here; the observed rules come in
through `HostObservation.ingress` (None: this host runs no ingress driver, and
ingress is neither acted on nor reported).

- provision: the `ingress` phase of a VM is proven when every planned endpoint
  of that VM has both halves (DNAT and forward) and our chains are hooked;
- release: `remove_ingress` while any rule of the released allocation is left
  (before its disks are wiped);
- drift, for every VM that passed readiness: a planned endpoint without both
  halves is `drift.ingress.missing` (heal: install it again); a rule of ours
  that no planned endpoint names, outside a release in progress, is
  `drift.ingress.extra`; a rule in our chains that is not ours is
  `drift.ingress.foreign` (heal for both: remove it).
"""

from __future__ import annotations

from collections.abc import Iterable

from host_reconciler.actions import Drift, DriftCode, Step
from host_reconciler.observations import HostObservation
from schemas.hostplans import HostPlan, IngressRule, VmSpec


def planned(plan: HostPlan, allocation_id: str) -> tuple[IngressRule, ...]:
    return tuple(r for r in plan.ingress if r.allocation_id == allocation_id)


def provisioned(plan: HostPlan, vm: VmSpec, observed: HostObservation) -> bool:
    """The `ingress` phase needs nothing: no endpoint planned, no driver, or every one in place."""
    want = planned(plan, vm.allocation_id)
    if not want or observed.ingress is None:
        return True
    return set(want) <= observed.ingress.complete


def left_behind(vm: VmSpec, observed: HostObservation) -> bool:
    """A released allocation still has a rule (either half) on this host."""
    seen = observed.ingress
    return seen is not None and any(r.allocation_id == vm.allocation_id for r in seen.written)


def drift(plan: HostPlan, observed: HostObservation, active: Iterable[VmSpec]) -> Iterable[Drift]:
    seen = observed.ingress
    if seen is None:
        return
    complete = seen.complete
    for vm in active:
        for rule in planned(plan, vm.allocation_id):
            if rule not in complete:
                yield Drift(
                    DriftCode.INGRESS_MISSING,
                    vm.bundles[0].slot_index if vm.bundles else None,
                    f"ingress {describe(rule)} of {vm.allocation_id} is missing"
                    + ("" if seen.hooked else " (our chains are not hooked)"),
                    allocation_id=vm.allocation_id,
                    expected=describe(rule),
                    heal=Step.INGRESS,
                )
    wanted = set(plan.ingress)
    releasing = {vm.allocation_id for vm in plan.releases}
    for rule in sorted(seen.written - wanted, key=describe):
        if rule.allocation_id in releasing:
            continue  # the release removes it, before the wipe
        yield Drift(
            DriftCode.INGRESS_EXTRA,
            None,
            f"ingress {describe(rule)} tagged {rule.allocation_id} is in no planned endpoint",
            allocation_id=rule.allocation_id,
            observed=describe(rule),
            heal=Step.REMOVE_STRAY_INGRESS,
        )
    for line in seen.foreign:
        yield Drift(
            DriftCode.INGRESS_FOREIGN,
            None,
            f"rule not written by gpuaas in an ingress chain: {line}",
            observed=line,
            heal=Step.REMOVE_STRAY_INGRESS,
        )


def describe(rule: IngressRule) -> str:
    return f"{rule.public_address}:{rule.public_port}->{rule.private_ip}:{rule.guest_port}"
