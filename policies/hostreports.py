"""What a host's drift report means for placement (seed 000, "Slice Drift Reconciliation").

"Drift should surface in admin node details and block reuse only for the
affected slot unless the evidence points to node-wide corruption." A host
reports drift per slot (`host_slot_status.drift`) and for the node
(`host_status.drift`, entries without a slot). The rules here turn those
codes into what the planner takes as plain values:

- a slot is blocked while its host reports blocking drift on it (its disk
  missing, mounted, carrying a signature while free, or the OS disk; its GPU
  or VF off the bus or not bound to vfio-pci; its disk identity changed), a
  report it could not trust (`drift.report.invalid`), or a failed wipe. It
  comes back when the host reports it clear;
- a node is corrupt when the host reports blocking (or untrusted) drift for
  the node itself, or blocking drift on every slot it reports (at least two):
  then the whole node takes nothing new, slices or a whole-node lease.

Pure: codes in, codes out.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import codes as policies_codes
from schemas import codes as schemas_codes

# The host's blocking drift (host_reconciler.actions.BLOCKING_DRIFT; a test keeps the two equal).
BLOCKING = frozenset(
    {
        policies_codes.DRIFT_DISK_MISSING,
        policies_codes.DRIFT_DISK_MOUNTED,
        policies_codes.DRIFT_DISK_SIGNATURE_PRESENT,
        policies_codes.DRIFT_DISK_OS_DISK,
        policies_codes.DRIFT_PCI_NOT_VFIO,
        policies_codes.DRIFT_PCI_MISSING,
        policies_codes.DRIFT_IDENTITY_CHANGED,
    }
)
INVALID = schemas_codes.DRIFT_REPORT_INVALID  # the stored report was malformed: nothing it says can be trusted
WIPE_FAILED = policies_codes.HOST_WIPE_FAILED  # the slot's last wipe or verify failed (cleanup_blocked on the host)
EVERY_SLOT = policies_codes.HOST_DRIFT_EVERY_SLOT  # node evidence: blocking drift on every reported slot


def slot_block(codes: Iterable[str], *, wipe_failed: bool = False) -> tuple[str, ...]:
    """The reasons a slot may not be placed, from its host's report (empty: the host reports it clear)."""
    found = {c for c in codes if c in BLOCKING or c == INVALID}
    if wipe_failed:
        found.add(WIPE_FAILED)
    return tuple(sorted(found))


def node_corruption(node_codes: Iterable[str], blocked_slots: int, reported_slots: int) -> tuple[str, ...]:
    """The evidence of node-wide corruption (empty: none): node drift, or every reported slot blocked."""
    found = {c for c in node_codes if c in BLOCKING or c == INVALID}
    if reported_slots >= 2 and blocked_slots >= reported_slots:
        found.add(EVERY_SLOT)
    return tuple(sorted(found))
