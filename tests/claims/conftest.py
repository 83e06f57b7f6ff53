"""Fixtures for the claims store tests: a connection and a small synced fleet.

node-00000 .. node-00003   slice nodes, 8 slots each (numa0: 0-3, numa1: 4-7)
node-00004, node-00005     baremetal nodes (no slot map)
alloc-0000000 ..           pending 1-GPU slice allocations, then 8-GPU baremetal ones
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from reconciler.store import connections, inventory
from reconciler.store.connections import Connection


@pytest.fixture
def conn(db_url: str) -> Iterator[Connection]:
    c = connections.connect(db_url, autocommit=True)
    try:
        yield c
    finally:
        c.close()


def small_fleet(**overrides: Any) -> DesiredState:
    args: dict[str, Any] = {"nodes": 4, "baremetal_nodes": 2, "allocations": 24, "baremetal_allocations": 4}
    args.update(overrides)
    return synthetic.fleet(**args)


@pytest.fixture
def fleet(conn: Connection) -> DesiredState:
    state = small_fleet()
    inventory.sync(conn, state)
    return state
