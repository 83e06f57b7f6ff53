"""What `gpuaas host discover` proposes beside the candidate SlotMap: a Node document and a blocker summary.

Pure: no I/O. A new host needs a Node document as well as its SlotMap;
operators used to copy one by hand and fix `os_disk`. Discovery knows the
node name, the OS disk's by-id path, the GPU model and whether slot disks are
tenant slices, so it proposes those. It cannot know where the host belongs:
`region` and `pool` are the placeholder `FILL-IN`, which no name pattern
accepts, so `gpuaas validate` refuses the document until an operator fills
them. The Node model has no `approval_required`; the proposal says
`admin_state: maintenance` instead, which keeps the node out of the catalog
until the operator sets it `active`.

The summary counts the slots that are ready once approved (the eligibility
`gpuaas validate` applies) and names each blocked slot's codes: the slot's
discovery blockers, or, for a slot without one, the eligibility reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from desired import models as m
from host_reconciler.discovery import candidates, facts, pci
from policies import eligibility

PLACEHOLDER = "FILL-IN"  # uppercase: refused by the Name pattern until replaced
PROPOSED_ADMIN_STATE = m.AdminState.MAINTENANCE


def node_document(candidate: candidates.Candidate, discovery: facts.Discovery) -> dict[str, Any]:
    """The Node document proposed for `candidate.node`, in the order the example fleet writes it."""
    os_disk = next((d.by_id for d in discovery.os_disks if d.by_id), None)
    doc: dict[str, Any] = {
        "apiVersion": m.API_VERSION,
        "kind": "Node",
        "name": candidate.node,
        "region": PLACEHOLDER,
        "pool": PLACEHOLDER,
    }
    tags = sorted({f"gpu-{pci.GPU_VENDORS.get(g.vendor, g.vendor)}-{g.model}" for g in discovery.gpus})
    if tags:
        doc["hardware_tags"] = tags
    doc["profile_tags"] = [m.PROFILE_SLICE_VM]
    doc["admin_state"] = PROPOSED_ADMIN_STATE.value
    doc["storage_mode"] = _storage_mode(candidate).value
    doc["os_disk"] = os_disk or PLACEHOLDER
    return doc


def _storage_mode(candidate: candidates.Candidate) -> m.StorageMode:
    slots = candidate.slot_map.slots if candidate.slot_map is not None else ()
    if any(s.capacity_metadata.storage_ownership == "slice" for s in slots):
        return m.StorageMode.SLICE
    return m.StorageMode.SHARE


@dataclass(frozen=True, slots=True)
class Summary:
    ready: tuple[int, ...]  # slots eligible once the map is approved
    blocked: dict[int, tuple[str, ...]]  # slot index -> the codes that block it

    def line(self) -> str:
        """`7 slots ready, 1 blocked: disk.mounted (slot 3)`."""
        head = f"{len(self.ready)} {_plural('slot', len(self.ready))} ready, {len(self.blocked)} blocked"
        if not self.blocked:
            return head
        by_code: dict[str, list[int]] = {}
        for index in sorted(self.blocked):
            for code in self.blocked[index]:
                by_code.setdefault(code, []).append(index)
        parts = [f"{code} ({_plural('slot', len(ix))} {_ranges(ix)})" for code, ix in by_code.items()]
        return f"{head}: {', '.join(parts)}"


def summary(candidate: candidates.Candidate) -> Summary:
    if candidate.slot_map is None:
        return Summary((), {})
    approved = candidate.slot_map.model_copy(update={"approval_required": False})
    reasons = eligibility.eligible_slots(approved)
    blocked: dict[int, tuple[str, ...]] = {}
    for slot in approved.slots:
        codes = tuple(dict.fromkeys(x.code for x in slot.blockers)) or tuple(
            r.code for r in reasons.get(slot.slot_index, ())
        )
        if codes:
            blocked[slot.slot_index] = codes
    return Summary(tuple(s.slot_index for s in approved.slots if s.slot_index not in blocked), blocked)


def _plural(word: str, n: int) -> str:
    return word if n == 1 else word + "s"


def _ranges(indexes: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[str] = []
    start = prev = indexes[0]
    for i in [*indexes[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)
