"""Desired state survives the store: `views.desired_state` is the inverse of the inventory rows.

`status` and `plan` rebuild desired state from the rows the last sync wrote;
a field the sync does not store vanishes from both (an Allocation's
lease_hours once did, then a Fleet's liveness TTL and provision attempts, its
regions' pools, its machine providers, a Node's machine). The example fleet,
with every field of every kind set to a value other than its default in at
least one document, is synced and rebuilt, and must come back document for
document. A field added to a model fails the guard until this test sets it,
and then fails the round trip until the rows store it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from desired import models as m
from desired.state import DesiredState
from reconciler import sources
from reconciler.store import inventory, lifecycle, views
from reconciler.store.connections import Connection

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"
KINDS = {"skus": m.Sku, "images": m.Image, "nodes": m.Node, "slot_maps": m.SlotMap, "allocations": m.Allocation}
# Fields the round trip cannot see, each with why.
EXEMPT = {
    (m.Fleet, old): f"a deprecated spelling of {new}: input only, stored and rebuilt under the current name"
    for old, new in m.DEPRECATED_FLEET_KEYS.items()
}


def _with(doc: BaseModel, **changes: Any) -> Any:
    """`doc` with `changes`, validated again (so every value is one git could hold)."""
    raw = {**doc.model_dump(mode="json", by_alias=True, exclude_none=True), **changes}
    return type(doc).model_validate({k: v for k, v in raw.items() if v is not None})


def _first(docs: Mapping[str, Any], pick: Any = None) -> str:
    return next(k for k in sorted(docs) if pick is None or pick(docs[k]))


def rich_state() -> DesiredState:
    """The example fleet with every optional field off its default somewhere."""
    state = sources.load(EXAMPLES).state
    assert state.fleet is not None
    state.fleet = _with(
        state.fleet,
        management_network={
            "subnet": "10.200.0.0/24",
            "gateway": "10.200.0.1",
            "dhcp_range": {"start": "10.200.0.10", "end": "10.200.0.200"},
            "bridge": "gpuaasbr1",
        },
        placement={**state.fleet.placement.model_dump(mode="json"), "policy": "first-fit", "max_claim_attempts": 7},
        graceful_shutdown_timeout_s=200,
        readiness_timeout_seconds=450,
        host_liveness_ttl_seconds=120,
        max_provision_attempts=5,
        ingress={"max_extra_ports": 9},
    )
    sku = _first(state.skus, lambda s: s.capacity_shape is m.CapacityShape.GPU_SLICE)
    state.skus[sku] = _with(
        state.skus[sku], same_node_required=False, currency="EUR", active=False, readiness_timeout_seconds=600
    )
    image = _first(state.images)
    state.images[image] = _with(
        state.images[image],
        size_bytes=123_456_789,
        cloud_init_supported=not m.Image.model_fields["cloud_init_supported"].default,
        guest_agent_supported=not m.Image.model_fields["guest_agent_supported"].default,
        active=False,
        inactive_since="2026-11-01T00:00:00Z",
        cache_pinned=True,
    )
    node = _first(state.nodes)
    state.nodes[node] = _with(
        state.nodes[node],
        admin_state="draining",
        management_network={
            "subnet": "10.210.0.0/24",
            "gateway": "10.210.0.1",
            "dhcp_range": {"start": "10.210.0.10", "end": "10.210.0.99"},
            "bridge": "gpuaasbr2",
        },
    )
    name = _first(state.slot_maps)
    smap = state.slot_maps[name]
    slots = [s.model_dump(mode="json", exclude_none=True) for s in smap.slots]
    slots[0].update(gpu_uuid="GPU-5f0c2b7e-0000-4000-8000-000000000001", vcpu_count=16, memory_mib=65536)
    slots[1].update(sharing_model="mig_partition", max_claims=2, compute_milli=500)
    slots[2].update(parent_slot_id="slot-0", enabled=False, blockers=[{"code": "slot.rma", "message": "awaiting RMA"}])
    state.slot_maps[name] = _with(smap, approval_required=True, slots=slots)
    alloc = _first(state.allocations)
    state.allocations[alloc] = _with(
        state.allocations[alloc],
        vm_profile="custom-profile",
        lease_hours=36.5,
        state="released",
        requested_at=dt.datetime(2026, 11, 2, 8, 0, tzinfo=dt.UTC).isoformat(),
    )
    return state


def _everywhere_default(model: type[BaseModel], docs: Iterable[BaseModel]) -> list[str]:
    docs = list(docs)
    out = []
    for name, f in model.model_fields.items():
        if name in ("api_version", "kind") or f.is_required() or (model, name) in EXEMPT:
            continue
        default = f.get_default(call_default_factory=True)
        if all(getattr(d, name) == default for d in docs):
            out.append(f"{model.__name__}.{name}")
    return out


def _dump(doc: BaseModel) -> dict[str, Any]:
    return doc.model_dump(mode="json", exclude={name for model, name in EXEMPT if model is type(doc)})


def test_the_state_sets_every_field_of_every_kind() -> None:
    state = rich_state()
    assert state.fleet is not None
    unset = _everywhere_default(m.Fleet, [state.fleet])
    for attr, model in KINDS.items():
        unset += _everywhere_default(model, getattr(state, attr).values())
    unset += _everywhere_default(m.Slot, [s for smap in state.slot_maps.values() for s in smap.slots])
    assert unset == [], f"set these in rich_state so the round trip covers them: {unset}"


def test_the_store_rebuilds_every_document_field_for_field(conn: Connection) -> None:
    state = rich_state()
    inventory.sync(conn, state)
    lifecycle.sync_settings(conn, state)
    rebuilt = views.desired_state(conn)
    assert state.fleet is not None and rebuilt.fleet is not None
    assert _dump(rebuilt.fleet) == _dump(state.fleet)
    for attr in KINDS:
        want, got = getattr(state, attr), getattr(rebuilt, attr)
        assert sorted(got) == sorted(want), attr
        for key, doc in want.items():
            assert _dump(got[key]) == _dump(doc), f"{attr}[{key}]"


def test_pinning_an_image_reaches_every_host_plan(conn: Connection) -> None:
    from reconciler.reconcile import reconciling
    from reconciler.store import hostplans

    state = sources.load(EXAMPLES).state
    reconciling.reconcile(conn, state)
    nodes = sorted(state.nodes)
    assert all(hostplans.read(conn, n).pinned_images == () for n in nodes)  # type: ignore[union-attr]
    slug = next(s for s in sorted(state.images) if state.images[s].digest_sha256)
    state.images[slug] = state.images[slug].model_copy(update={"cache_pinned": True})
    reconciling.reconcile(conn, state)
    digest = state.images[slug].digest_sha256
    for n in nodes:
        assert hostplans.read(conn, n).pinned_images == (digest,), n  # type: ignore[union-attr]
