"""A capacity read model reusing an earlier one's per-node parts (`capacity.Memo`) equals one built fresh.

A PR plan reads base's capacity, then head's over nearly the same fleet;
head's reuses base's part of every node the PR leaves alone: slice counts
and, for whole-node (baremetal) SKUs, whether a node is in use or why it is
not usable. Reused only while the SKU and the node's facts are the very same
objects and its claims are equal: a node whose claims, slot statuses or
document change is counted again.
"""

from __future__ import annotations

from typing import Any

import pytest

from desired import models as m
from desired.state import DesiredState
from reconciler import plans
from reconciler.placement import capacity, placing, replanning, synthesis
from schemas import states

NODES = [synthesis.node_name(i, False) for i in range(6)]


def _claims(*held: tuple[str, str, int | None]) -> tuple[plans.ExistingClaim, ...]:
    out = []
    for allocation, node, slot in held:
        kind = states.ClaimKind.NODE_EXCLUSIVE if slot is None else states.ClaimKind.SLOT
        out.append(plans.ExistingClaim(allocation, node, kind, slot, states.ClaimStatus.ACTIVE, "t"))
    return tuple(out)


def _drained(state: DesiredState, node: str) -> DesiredState:
    """`state` with one node set to draining: every other document is the same object."""
    head = DesiredState(
        fleet=state.fleet,
        skus=state.skus,
        images=state.images,
        nodes=dict(state.nodes),
        slot_maps=state.slot_maps,
        allocations=state.allocations,
    )
    head.nodes[node] = state.nodes[node].model_copy(update={"admin_state": m.AdminState.DRAINING})
    return head


def test_baremetal_parts_are_reused_only_for_unchanged_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    base = synthesis.desired_state(synthesis.fleet_documents(len(NODES)))
    assert {n.baremetal_sku for n in base.nodes.values()} == {synthesis.H200_BAREMETAL}
    before = plans.Observed(claims=_claims(("whole", NODES[0], None), ("slice", NODES[1], 0)))
    # head: NODES[0] released, NODES[2] leased whole, NODES[3] drained, a slot of NODES[4] in cleanup
    after = plans.Observed(
        claims=_claims(("slice", NODES[1], 0), ("whole-2", NODES[2], None)),
        slot_status={(NODES[4], 3): states.SlotStatus.CLEANUP},
    )
    head = _drained(base, NODES[3])
    asked: list[str] = []
    real = capacity._whole_reason

    def counted(sku: Any, f: Any, claims: Any) -> Any:
        asked.append(f.name)
        return real(sku, f, claims)

    monkeypatch.setattr(capacity, "_whole_reason", counted)
    warm, memo = replanning.WarmPlanner(), capacity.Memo()
    capacity.read_model(base, before, engine=warm.engine(base, before), memo=memo)
    assert sorted(asked) == NODES[1:]  # NODES[0] is in use: no reason asked
    assert len(memo.wholes) == len(NODES)
    asked.clear()
    reused = capacity.read_model(head, after, engine=warm.engine(head, after), memo=memo)
    # counted again: its claims changed (0; 2 is in use, no reason asked), its document (3), a slot status (4)
    assert sorted(asked) == [NODES[0], NODES[3], NODES[4]]
    fresh = capacity.read_model(head, after, engine=placing.Engine(head, after), memo=capacity.Memo())
    assert reused == fresh
    whole = next(o for o in fresh.offers if o.sku == synthesis.H200_BAREMETAL)
    assert (whole.in_use, whole.total) == (1, len(NODES))
    assert dict(whole.not_launchable) == {
        capacity.Blocked.SLICE_ACTIVE.value: 1,
        capacity.Blocked.DRAINING.value: 1,
        capacity.Blocked.CLEANUP.value: 1,
    }
