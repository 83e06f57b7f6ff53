"""A baremetal lease through a real standalone Ironic (fake-hardware): the real provision state machine.

available -> deploying -> active (configdrive with the tenant's keys) -> deleting -> cleaning -> available
"""

from __future__ import annotations

import time

from gpuaas_tools.bench import leases as fleets
from gpuaas_tools.lab.ironic_service import IronicService
from reconciler.providers.ironic import IronicProvider
from reconciler.reconcile import reconciling
from reconciler.store import checks, leases
from reconciler.store.connections import Connection
from tests.baremetal.conftest import Listener

A0 = "alloc-0000000"


def _status(conn: Connection, aid: str) -> str:
    row = conn.execute("SELECT status FROM allocations WHERE id = %s", (aid,)).fetchone()
    return str(row[0]) if row else "?"


def test_ironic_lease_runs_the_real_state_machine(conn: Connection, ironic: IronicService, ssh: Listener) -> None:
    provider = {"name": "ironic-lab", "kind": "ironic", "url": ironic.url, "timeout_s": 30}
    state = fleets.fleet(provider=provider, baremetal_nodes=1, leases=1, ssh_address=ssh.address)
    deadline = time.monotonic() + 120
    while _status(conn, A0) != "active":
        assert time.monotonic() < deadline, leases.details(conn, [A0])
        reconciling.reconcile(conn, state)
        time.sleep(0.2)
    node = ironic.node("bm-00000")
    assert node["provision_state"] == "active" and node["instance_info"]["gpuaas_allocation"] == A0
    seen = IronicProvider("ironic-lab", ironic.url).machine("bm-00000")
    assert seen.allocation_id == A0
    gone = fleets.released(state)
    while _status(conn, A0) != "released":
        assert time.monotonic() < deadline, leases.details(conn, [A0])
        reconciling.reconcile(conn, gone)
        time.sleep(0.2)
    lease = leases.details(conn, [A0])[A0]
    assert lease["phase"] == "erased" and lease["deploy_requests"] == 1 and lease["erase_requests"] == 1
    assert lease["erase_evidence"]["method"] == "automated_clean" and lease["erase_evidence"]["verified"] is True
    assert ironic.node("bm-00000")["provision_state"] == "available"
    assert checks.run(conn) == []
