"""The step table: one function per `actions.Step`, run by `converging`.

The steps live by what they do: `provisioning`, `releasing` and `healing`;
the context they run in, and the inputs it builds, in `context`. Each step
is idempotent: run twice, or again after a crash at any instant, it ends in
the same state (a lease taken with link(2), files renamed into place,
libvirt define replacing a definition, stop and undefine treating a missing
domain as done, wipe and verify repeatable). Each re-checks the live state
it acts on rather than trusting the pass-start observation, and returns
extra facts for the journal (image identity, readiness timings, wipe
evidence).

Failures are exceptions of the project's two kinds; `converging` decides
what a failure means (retry, failed VM, cleanup-blocked slot) in one place.
"""

from __future__ import annotations

from collections.abc import Callable

from host_reconciler import healing, ingressing, provisioning, releasing
from host_reconciler.actions import Action, Step
from host_reconciler.context import Context, Result
from schemas.hostplans import VmSpec

StepFn = Callable[[Context, Action, VmSpec | None], Result]

STEPS: dict[Step, StepFn] = {
    Step.LEASE: provisioning.lease,
    Step.HOST_CHECKS: provisioning.host_checks,
    Step.VFIO_CHECK: provisioning.vfio_check,
    Step.IMAGE_FETCH: provisioning.image_fetch,
    Step.IMAGE_VERIFY: provisioning.image_verify,
    Step.CLOUD_INIT_SEED: provisioning.cloud_init_seed,
    Step.DHCP_RESERVATION: provisioning.dhcp_reservation,
    Step.DISK_WRITE: provisioning.disk_write,
    Step.DEFINE_START: provisioning.define_start,
    Step.INGRESS: ingressing.install,
    Step.READINESS: provisioning.readiness,
    Step.GRACEFUL_STOP: releasing.graceful_stop,
    Step.HARD_STOP: releasing.hard_stop,
    Step.UNDEFINE: releasing.undefine,
    Step.REMOVE_RESERVATION: releasing.remove_reservation,
    Step.REMOVE_INGRESS: ingressing.remove,
    Step.WIPE: releasing.wipe,
    Step.VERIFY: releasing.verify,
    Step.SLOT_HEALTH: releasing.slot_health,
    Step.REPORT_FREE: releasing.report_free,
    Step.START_DOMAIN: healing.start_domain,
    Step.REDEFINE_DOMAIN: healing.redefine_domain,
    Step.REMOVE_ORPHAN_DOMAIN: healing.remove_orphan_domain,
    Step.REMOVE_STALE_RESERVATION: healing.remove_stale_reservation,
    Step.REMOVE_ORPHAN_SEED: healing.remove_orphan_seed,
    Step.REMOVE_ORPHAN_LEASE: healing.remove_orphan_lease,
    Step.REMOVE_STRAY_INGRESS: ingressing.remove_strays,
}
