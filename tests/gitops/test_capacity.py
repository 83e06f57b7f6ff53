"""The capacity read model and PR plan composition, pure: desired state + observed facts in, values out.

us-east-1 / h200-slice (both nodes slice-capable, baremetal SKU h200-sxm-baremetal-8g)
  h200-use1-s01  numa0 [0 1 2 3]  numa1 [4 5 6 7]
  h200-use1-s02  numa0 [0 1 2 3]  numa1 [4 5 6 7]
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from desired.state import DesiredState
from reconciler import plans, sources
from reconciler.placement import capacity, prplan
from schemas import states
from tests.gitops.conftest import make_fleet

S01, S02 = "h200-use1-s01", "h200-use1-s02"
SLOT = states.ClaimKind.SLOT


def _state(tmp_path: Path, edits: dict[str, tuple[str, str]] | None = None) -> DesiredState:
    root = tmp_path / "fleet"
    make_fleet(root)
    for rel, (old, new) in (edits or {}).items():
        path = root / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))
    result = sources.load(root)
    assert not result.errors, result.errors
    return result.state


def _claim(
    alloc: str,
    node: str,
    idx: int | None,
    status: states.ClaimStatus = states.ClaimStatus.ACTIVE,
    kind: states.ClaimKind = SLOT,
) -> plans.ExistingClaim:
    return plans.ExistingClaim(alloc, node, kind, idx, status, "acme")


def _offer(model: capacity.ReadModel, sku: str = "h200-sxm-slice") -> capacity.Offer:
    return next(o for o in model.offers if o.sku == sku and o.region == "us-east-1")


def _sizes(offer: capacity.Offer) -> dict[int, int]:
    return {s.gpu_count: s.launchable for s in offer.sizes}


@pytest.mark.parametrize(
    ("edits", "observed", "blocked", "sizes"),
    [
        pytest.param({}, plans.Observed(), {}, {1: 16, 2: 8, 4: 4, 8: 2}, id="empty fleet"),
        pytest.param(
            {f"nodes/{S02}.yaml": ("admin_state: active", "admin_state: draining")},
            plans.Observed(),
            {"draining": 8},
            {1: 8, 2: 4, 4: 2, 8: 1},
            id="draining node",
        ),
        pytest.param(
            {f"nodes/{S02}.yaml": ("admin_state: active", "admin_state: maintenance")},
            plans.Observed(),
            {"maintenance": 8},
            {1: 8, 2: 4, 4: 2, 8: 1},
            id="maintenance",
        ),
        pytest.param(
            {f"nodes/{S02}.yaml": ("pool: h200-slice", "pool: h200-slice\norg: initech")},
            plans.Observed(),
            {"tenant_boundary": 8},
            {1: 8, 2: 4, 4: 2, 8: 1},
            id="tenant boundary",
        ),
        pytest.param(
            {f"slotmaps/{S02}.yaml": ("network_fabric: infiniband", "network_fabric: ethernet")},
            plans.Observed(),
            {"fabric": 1},
            {1: 15, 2: 7, 4: 3, 8: 1},
            id="one slot without IB",
        ),
        pytest.param(
            {},
            plans.Observed(unavailable_nodes=frozenset({S02})),
            {"unhealthy": 8},
            {1: 8, 2: 4, 4: 2, 8: 1},
            id="unhealthy",
        ),
        pytest.param(
            {},
            plans.Observed(firmware_ready=MappingProxyType({S02: False})),
            {"not_slice_ready": 8},
            {1: 8, 2: 4, 4: 2, 8: 1},
            id="firmware not ready",
        ),
        pytest.param(
            {},
            plans.Observed(
                claims=(_claim("a", S01, 0, states.ClaimStatus.RELEASING),),
                slot_status=MappingProxyType({(S01, 0): states.SlotStatus.CLEANUP}),
            ),
            {"cleanup": 1},
            {1: 15, 2: 7, 4: 3, 8: 1},
            id="cleanup",
        ),
        pytest.param(
            {},
            plans.Observed(slot_status=MappingProxyType({(S01, 3): states.SlotStatus.CLEANUP_BLOCKED})),
            {"cleanup_blocked": 1},
            {1: 15, 2: 7, 4: 3, 8: 1},
            id="cleanup blocked",
        ),
    ],
)
def test_why_free_slots_are_not_launchable(
    tmp_path: Path,
    edits: dict[str, tuple[str, str]],
    observed: plans.Observed,
    blocked: dict[str, int],
    sizes: dict[int, int],
) -> None:
    offer = _offer(capacity.read_model(_state(tmp_path, edits), observed))
    assert dict(offer.not_launchable) == blocked
    assert _sizes(offer) == sizes
    assert offer.usable == offer.free - sum(blocked.values())


def test_topology_strands_free_gpus_per_size(tmp_path: Path) -> None:
    """One claim in each NUMA group of both nodes: 12 free GPUs, yet no 4-GPU or 8-GPU slice fits."""
    claims = tuple(_claim(f"a{n}{i}", n, i) for n in (S01, S02) for i in (0, 4))
    offer = _offer(capacity.read_model(_state(tmp_path), plans.Observed(claims=claims)))
    assert (offer.in_use, offer.free, offer.usable) == (4, 12, 12)
    by = {s.gpu_count: s for s in offer.sizes}
    assert (by[4].launchable, by[4].stranded_gpus, by[4].limit_code) == (0, 12, "plan.sku_unavailable.topology")
    assert (by[8].launchable, by[8].stranded_gpus) == (0, 12)
    assert by[2].launchable == 6 and by[1].launchable == 12  # 2-GPU: NUMA-aligned preferred, not required


def test_baremetal_counts_whole_nodes_and_slice_claims_block_them(tmp_path: Path) -> None:
    observed = plans.Observed(claims=(_claim("a", S01, 2),))
    offer = _offer(capacity.read_model(_state(tmp_path), observed), "h200-sxm-baremetal-8g")
    assert (offer.unit, offer.total, offer.in_use, offer.usable) == ("node", 2, 0, 1)
    assert dict(offer.not_launchable) == {"slice_active": 1}
    assert _sizes(offer) == {8: 1}


def test_dedicated_nodes_are_counted_for_their_tenant(tmp_path: Path) -> None:
    state = _state(tmp_path, {f"nodes/{S02}.yaml": ("pool: h200-slice", "pool: h200-slice\norg: initech")})
    offer = _offer(capacity.read_model(state, plans.Observed()))
    assert {g.gpu_count: g.launchable for g in offer.dedicated["initech"]} == {1: 16, 2: 8, 4: 4, 8: 2}


def test_node_summaries_show_mode_slots_and_drained(tmp_path: Path) -> None:
    state = _state(tmp_path, {f"nodes/{S02}.yaml": ("admin_state: active", "admin_state: draining")})
    observed = plans.Observed(claims=(_claim("a", S01, 0), _claim("b", S01, 1, states.ClaimStatus.RESERVED)))
    nodes = {n.name: n for n in capacity.read_model(state, observed).nodes}
    assert nodes[S01].mode == "slice_active" and nodes[S01].allocations == ("a", "b")
    assert dict(nodes[S01].slots) == {"active": 1, "available": 6, "reserved": 1}
    assert (nodes[S02].mode, nodes[S02].drained) == ("draining", True)


def test_offers_without_node_summaries_are_the_same_offers(tmp_path: Path) -> None:
    """A PR plan asks for offers alone (`summaries=False`): the same offers, no node list."""
    state = _state(tmp_path, {f"nodes/{S02}.yaml": ("admin_state: active", "admin_state: draining")})
    observed = plans.Observed(claims=(_claim("a", S01, 0), _claim("b", S01, 1, states.ClaimStatus.RESERVED)))
    whole = capacity.read_model(state, observed)
    offers = capacity.read_model(state, observed, summaries=False)
    assert offers.offers == whole.offers and whole.nodes
    assert offers.nodes == ()


def test_offline_observed_and_an_unchanged_head_plan_nothing(tmp_path: Path) -> None:
    state = _state(tmp_path)
    observed = prplan.offline_observed(state)
    assert observed.claims == ()
    pr = prplan.compose(state, state, observed, offline=True)
    assert not pr.changed and pr.valid and pr.capacity_changes == ()


def test_after_applies_placements_and_releases(tmp_path: Path) -> None:
    observed = plans.Observed(claims=(_claim("old", S01, 0),))
    plan = plans.Plan(
        placements=(
            plans.Placement("new", "acme", "h200-sxm-slice", "gpu_slice", 2, "us-east-1", S02, (0, 1), None, None),
        ),
        releases=(plans.Release("old", S01, (0,)),),
    )
    later = prplan.after(observed, plan)
    assert {(c.allocation_id, c.slot_index, c.status) for c in later.claims} == {
        ("old", 0, states.ClaimStatus.RELEASING),
        ("new", 0, states.ClaimStatus.RESERVED),
        ("new", 1, states.ClaimStatus.RESERVED),
    }
    assert later.slot_status[(S01, 0)] is states.SlotStatus.CLEANUP and "new" in later.placed


def test_orphaned_allocations_are_reported(tmp_path: Path) -> None:
    state = _state(tmp_path)
    pr = prplan.compose(state, state, plans.Observed(claims=(_claim("gone", S01, 0),)), offline=False)
    assert pr.orphaned == ("gone",)
