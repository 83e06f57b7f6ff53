"""Absorb host reports: VMs ready -> claims active; wipe proof -> slots free.

The host reconciler writes host_status / host_slot_status; these functions
move claims, slots and allocations forward from what it reported:

- a VM reported provisioning or ready for the claim's allocation on that
  slot moves the claim and slot to provisioning or active (usage starts at the
  host's ready time);
- a releasing claim leaves the live set only with verified cleanup proof
  (schemas/sql/0003 claim_cleanup_proven): the slot becomes available
  (or disabled when git no longer offers it); a failed wipe blocks that slot
  only (cleanup_blocked) until a later verified wipe frees it.

The database enforces the same rule: a claim cannot become released without
the proof, and a slot cannot look free while a live claim holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.store.connections import Connection
from schemas import dberrors


@dataclass(frozen=True, slots=True)
class Freed:
    node: str | None
    slot_index: int | None
    allocation_id: str
    outcome: str  # freed | blocked | released (the allocation's last claim was freed)


@dataclass(frozen=True, slots=True)
class AbsorbResult:
    moved: int
    freed: tuple[Freed, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({f.node for f in self.freed if f.node}))

    @property
    def changed(self) -> bool:
        return bool(self.moved or self.freed)


def free_cleaned(conn: Connection, node: str | None = None) -> tuple[Freed, ...]:
    """Free every releasing slot (of one node, or all) whose host status proves the wipe."""
    with dberrors.wrapped("free cleaned slots"), conn.transaction():
        rows = conn.execute(
            "SELECT node, slot_index, allocation_id, outcome FROM gpuaas_free_cleaned(%s)", (node,)
        ).fetchall()
    return tuple(Freed(n, i, str(a), str(o)) for n, i, a, o in rows)


def absorb_vm_states(conn: Connection, node: str | None = None) -> int:
    """Move claims to provisioning/active from host VM reports; returns rows changed."""
    with dberrors.wrapped("absorb host VM states"), conn.transaction():
        row = conn.execute("SELECT gpuaas_absorb_vm_states(%s)", (node,)).fetchone()
    return int(row[0]) if row else 0


def absorb(conn: Connection, node: str | None = None) -> AbsorbResult:
    return AbsorbResult(absorb_vm_states(conn, node), free_cleaned(conn, node))
