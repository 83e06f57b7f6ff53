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
from reconciler.store import inventory, readmodels
from reconciler.store.connections import Connection

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fleet"


def test_every_allocation_field_survives_sync_and_rebuild(conn: Connection) -> None:
    state = sources.load(EXAMPLES).state
    first = next(iter(sorted(state.allocations)))
    a = state.allocations[first]
    # Every optional field set to a non-default value, so a dropped column cannot hide behind a default.
    state.allocations[first] = a.model_copy(update={"lease_hours": 36.5, "state": m.AllocationState.RELEASED,
                                                    "requested_at": dt.datetime(2026, 11, 2, 8, 0, tzinfo=dt.UTC)})
    unset = [name for name, f in m.Allocation.model_fields.items()
             if getattr(state.allocations[first], name) == f.default and name not in ("vm_profile", "image")]
    assert unset == [], f"set these in the test so the guard covers them: {unset}"
    inventory.sync(conn, state)
    rebuilt = readmodels.desired_state(conn)
    for aid, want in state.allocations.items():
        got = rebuilt.allocations[aid].model_dump(mode="json")
        assert got == want.model_dump(mode="json"), aid
