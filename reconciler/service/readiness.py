"""What /readyz says about HEAD: content only, the HTTP side is in `server`.

A HEAD that is not applied (an invalid commit, a force-push behind the
applied revision, a revision whose reconciliation keeps failing) used to
leave /readyz at 200: the banner said it, the signals an operator pages on
did not. After `--unapplied-grace` seconds (a normal commit is applied in
seconds; a grace keeps a deploy from flapping) the service is not ready
with `ready.head_unapplied`, naming the commit and its first error.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler.store import history

HEAD_UNAPPLIED = reconciler_codes.READY_HEAD_UNAPPLIED
FAILING = reconciler_codes.READY_RECONCILIATION_FAILING


def failing_check(
    health: history.Health, now: dt.datetime, grace_s: float, checks: dict[str, Any]
) -> tuple[str, str] | None:
    """(code, message) when reconciliations have failed for `grace_s` or longer; fills `checks["failing"]`."""
    if not health.failing or health.failing_since is None:
        return None
    failing_for = (now - health.failing_since).total_seconds()
    checks["failing"] = {"since": health.failing_since, "failures": health.failures, "code": health.failing_code}
    if failing_for < grace_s:
        return None
    return FAILING, (
        f"reconciliation has failed for {failing_for:.0f}s ({health.failures} run(s)), "
        f"newest: {health.failing_code}: {health.failing_message}"
    )


def head_check(
    health: history.Health, now: dt.datetime, grace_s: float, checks: dict[str, Any]
) -> tuple[str, str] | None:
    """(code, message) when HEAD has not been applied for `grace_s` or longer; fills `checks["head"]`."""
    head = health.head
    if head is None:
        return None
    checks["head"] = {
        "revision": head.revision,
        "applied": head.applied,
        "since": head.since,
        "code": head.code,
        "message": head.message,
    }
    if head.applied or head.since is None:
        return None
    unapplied_for = (now - head.since).total_seconds()
    if unapplied_for < grace_s:
        return None
    first = f"{head.code}: {head.message}" if head.code else "no error recorded"
    return HEAD_UNAPPLIED, (
        f"HEAD {(head.revision or '-')[:12]} has not been applied for {unapplied_for:.0f}s "
        f"(grace {grace_s:g}s; {(health.last_applied_revision or '-')[:12]} stays in force): "
        f"{first}"
    )
