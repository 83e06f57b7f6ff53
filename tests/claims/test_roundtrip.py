"""Every field git declares survives the database (issue 14: lease_hours was silently dropped).

`status` and `plan` rebuild desired state from the inventory rows the last
sync wrote; a field the sync does not store would vanish from both. The
example fleet, with every optional Allocation field set, is synced and
rebuilt; each Allocation must come back field for field.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from desired import models as m
from reconciler import sources
from reconciler.store import inventory, views
from reconciler.store.connections import Connection

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"


def test_every_allocation_field_survives_sync_and_rebuild(conn: Connection) -> None:
    state = sources.load(EXAMPLES).state
    first = next(iter(sorted(state.allocations)))
    a = state.allocations[first]
    # Every optional field set to a non-default value, so a dropped column cannot hide behind a default.
    state.allocations[first] = a.model_copy(
        update={
            "lease_hours": 36.5,
            "state": m.AllocationState.RELEASED,
            "requested_at": dt.datetime(2026, 11, 2, 8, 0, tzinfo=dt.UTC),
        }
    )
    unset = [
        name
        for name, f in m.Allocation.model_fields.items()
        if getattr(state.allocations[first], name) == f.default and name not in ("vm_profile", "image")
    ]
    assert unset == [], f"set these in the test so the guard covers them: {unset}"
    inventory.sync(conn, state)
    rebuilt = views.desired_state(conn)
    for aid, want in state.allocations.items():
        got = rebuilt.allocations[aid].model_dump(mode="json")
        assert got == want.model_dump(mode="json"), aid


def test_every_image_field_survives_sync_and_rebuild(conn: Connection) -> None:
    state = sources.load(EXAMPLES).state
    slug = next(iter(sorted(state.images)))
    state.images[slug] = state.images[slug].model_copy(
        update={"active": False, "inactive_since": dt.datetime(2026, 11, 1, tzinfo=dt.UTC), "cache_pinned": True}
    )
    unset = [
        name
        for name, f in m.Image.model_fields.items()
        if getattr(state.images[slug], name) == f.default
        and name
        not in (
            "accelerator_model",
            "size_bytes",
            "compatible_skus",
            "network_fabric",
            "cloud_init_supported",
            "guest_agent_supported",
        )
    ]
    assert unset == [], f"set these in the test so the guard covers them: {unset}"
    inventory.sync(conn, state)
    rebuilt = views.desired_state(conn)
    for name, want in state.images.items():
        assert rebuilt.images[name].model_dump(mode="json") == want.model_dump(mode="json"), name


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
