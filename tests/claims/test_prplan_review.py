"""The PR comment against a real store: who a drain affects, tenants, capacity per SKU, no false orphans (issue 34)."""

from __future__ import annotations

import copy

from desired import models as m
from desired.state import DesiredState
from reconciler.placement import prplan, prplan_render
from reconciler.reconcile import reconciling
from reconciler.store import live
from reconciler.store.connections import Connection
from tests.claims.test_get_describe import failed  # noqa: F401  # the fixture, shared
from tests.claims.test_lifecycle import fleet, where


def test_a_failed_allocation_whose_claims_still_release_is_not_called_undeclared(
    failed: tuple[DesiredState, str, str],  # noqa: F811  # the fixture
    conn: Connection,
) -> None:
    state, _, _ = failed
    pr = prplan.compose(state, state, live.observe(conn), offline=False)
    assert pr.orphaned == ()  # it is declared; its failed attempt's claims are labelled `ID@attempt-1`
    assert "no longer declared" not in prplan_render.render_markdown(pr)


def _drained(state: DesiredState, node: str) -> DesiredState:
    head = copy.copy(state)
    head.nodes = {**state.nodes, node: state.nodes[node].model_copy(update={"admin_state": m.AdminState.DRAINING})}
    head.revision = "head"
    return head


def test_a_drain_names_the_allocations_and_tenants_it_affects(conn: Connection) -> None:
    state = fleet(allocations=2)
    reconciling.reconcile(conn, state)
    aid = sorted(state.allocations)[0]
    node, slots = where(conn, aid)
    assert node is not None
    tenant = state.allocations[aid].tenant
    pr = prplan.compose(state, _drained(state, node), live.observe(conn), offline=False)

    hit = [a for a in pr.affected if a.allocation_id == aid]
    assert hit and hit[0].tenant == tenant and hit[0].node == node and hit[0].slot_indexes == slots
    assert "admin_state: active -> draining" in hit[0].change

    md = prplan_render.render_markdown(pr)
    assert md.endswith("\n") and not md.endswith("\n\n")  # a file with a final newline, once
    nodes = md.split("Nodes: capability and mode")[1].split("</details>")[0]
    row = next(line for line in nodes.splitlines() if f"`{node}`" in line)
    assert r"admin\_state: active → draining" in row and tenant.replace("_", r"\_") in row  # the Why and who runs there
    assert "Running allocations on changed nodes" in md and f"`{aid}`" in md
    assert "Capacity per SKU" in md  # the drained node's slots leave the usable count
    sku_rows = pr.sku_capacity
    assert any(c.usable_after < c.usable_before and c.total_after == c.total_before for c in sku_rows)


def test_a_release_names_its_tenant(conn: Connection) -> None:
    state = fleet(allocations=1)
    reconciling.reconcile(conn, state)
    (aid,) = state.allocations
    head = copy.copy(state)
    head.allocations = {aid: state.allocations[aid].model_copy(update={"state": m.AllocationState.RELEASED})}
    head.revision = "head"
    pr = prplan.compose(state, head, live.observe(conn), offline=False)
    assert [r.allocation_id for r in pr.plan.releases] == [aid]
    releases = prplan_render.render_markdown(pr).split("<b>Releases</b>")[1].split("</details>")[0]
    assert state.allocations[aid].tenant in releases
    assert prplan_render.as_dict(pr)["releases"][0]["tenant"] == state.allocations[aid].tenant
