"""One long-lived session places every mix of claim kinds (regression: issue 18).

PL/pgSQL caches a plan per statement for the life of a session. A record
variable filled from two different queries (a slot claim reads the slot's
domain-typed status, a node claim reads NULL::text) gave the cached plan a
different parameter type on the second kind, and every later placement in
that session failed with "type of parameter N does not match that when
preparing the plan". The same connection must serve any order of kinds.
"""

from __future__ import annotations

import itertools

import pytest

from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from reconciler.store import checks, claims
from reconciler.store.connections import Connection
from tests.claims.test_apply import baremetal_placement, slice_placement

SLICE_IDS = [synthetic.allocation_id(j) for j in range(24)]
BAREMETAL_IDS = [synthetic.allocation_id(24 + j) for j in range(4)]


@pytest.mark.parametrize("order", ["baremetal-slice", "slice-baremetal", "interleaved"])
def test_every_order_of_claim_kinds_places_on_one_connection(conn: Connection, fleet: DesiredState, order: str) -> None:
    slices = iter(SLICE_IDS)
    bare = iter(BAREMETAL_IDS)
    # Baremetal goes to the baremetal nodes and the spare slice nodes; slices share node-00000.
    bare_nodes = iter(["node-00004", "node-00005", "node-00003", "node-00002"])
    free_slot = itertools.count()
    kinds = {"baremetal-slice": "BBSSSS", "slice-baremetal": "SSSSBB", "interleaved": "BSBSSBS"}[order]
    for kind in kinds:
        if kind == "B":
            p = baremetal_placement(next(bare), next(bare_nodes))
        else:
            p = slice_placement(next(slices), "node-00000", (next(free_slot),))
        r = claims.place(conn, p, revision="rev")
        assert r.placed, (kind, r)
    assert checks.run(conn) == []
