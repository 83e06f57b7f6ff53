"""Fleet.graceful_timeout_seconds bounds readiness (seed 002: 30-900, default 300).

The earlier name `readiness_timeout_s` is still read (Fleet files written
before), with the same range, and may not disagree with the new one. Tests
that need a shorter wait set the host plan's `readiness_timeout_s` directly
(tests/host/conftest.py), never the Fleet document.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from desired import models as m
from gpuaas_tools.bench import synthetic
from reconciler.reconcile import reconciling
from reconciler.store import connections, hostplans

BASE: dict[str, Any] = {
    "apiVersion": m.API_VERSION,
    "kind": "Fleet",
    "name": "f",
    "regions": [{"name": "r", "pools": [{"name": "p"}]}],
}


@pytest.mark.parametrize(
    ("given", "timeout"),
    [
        ({}, 300),
        ({"graceful_timeout_seconds": 30}, 30),
        ({"graceful_timeout_seconds": 900}, 900),
        ({"readiness_timeout_s": 120}, 120),  # deprecated name
        ({"readiness_timeout_s": 120, "graceful_timeout_seconds": 120}, 120),
    ],
)
def test_accepted(given: dict[str, Any], timeout: int) -> None:
    assert m.Fleet.model_validate({**BASE, **given}).graceful_timeout_seconds == timeout


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"graceful_timeout_seconds": 29}, "greater than or equal to 30"),
        ({"graceful_timeout_seconds": 901}, "less than or equal to 900"),
        ({"readiness_timeout_s": 5}, "greater than or equal to 30"),  # the old range (1-3600) is gone
        ({"readiness_timeout_s": 3600}, "less than or equal to 900"),
        ({"readiness_timeout_s": 120, "graceful_timeout_seconds": 60}, "disagree"),
    ],
)
def test_refused(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        m.Fleet.model_validate({**BASE, **given})


def test_the_host_plan_carries_the_fleet_timeout(db_url: str) -> None:
    state = synthetic.fleet(nodes=1, allocations=1, baremetal_nodes=0, baremetal_allocations=0)
    assert state.fleet is not None
    state.fleet = m.Fleet.model_validate({**state.fleet.model_dump(by_alias=True), "graceful_timeout_seconds": 45})
    with connections.connect(db_url, autocommit=True) as conn:
        reconciling.reconcile(conn, state)
        plan = hostplans.read(conn, "node-00000")
    assert plan is not None and plan.readiness_timeout_s == 45
