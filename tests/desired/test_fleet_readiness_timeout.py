"""Fleet.readiness_timeout_seconds bounds readiness (seed 002's graceful_timeout_seconds: 30-900, default 300).

The earlier names `graceful_timeout_seconds` and `readiness_timeout_s` are still
read (Fleet files written before), with the same range, may not disagree with
the new one, and draw a warning naming file:line and the new key. Tests
that need a shorter wait set the host plan's `readiness_timeout_s` directly
(tests/host/conftest.py), never the Fleet document.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from desired import models as m
from desired.reading import loading
from gpuaas_tools.bench import synthetic
from policies import validation
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
        ({"readiness_timeout_seconds": 30}, 30),
        ({"readiness_timeout_seconds": 900}, 900),
        ({"graceful_timeout_seconds": 45}, 45),  # deprecated names
        ({"readiness_timeout_s": 120}, 120),
        ({"readiness_timeout_s": 120, "graceful_timeout_seconds": 120}, 120),
        ({"readiness_timeout_s": 120, "readiness_timeout_seconds": 120}, 120),
    ],
)
def test_accepted(given: dict[str, Any], timeout: int) -> None:
    assert m.Fleet.model_validate({**BASE, **given}).readiness_timeout_seconds == timeout


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"readiness_timeout_seconds": 29}, "greater than or equal to 30"),
        ({"readiness_timeout_seconds": 901}, "less than or equal to 900"),
        ({"graceful_timeout_seconds": 29}, "greater than or equal to 30"),
        ({"readiness_timeout_s": 5}, "greater than or equal to 30"),  # the old range (1-3600) is gone
        ({"readiness_timeout_s": 3600}, "less than or equal to 900"),
        ({"readiness_timeout_s": 120, "graceful_timeout_seconds": 60}, "disagree"),
        ({"graceful_timeout_seconds": 60, "readiness_timeout_seconds": 90}, "disagree"),
    ],
)
def test_refused(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        m.Fleet.model_validate({**BASE, **given})


def test_the_host_plan_carries_the_fleet_timeout(db_url: str) -> None:
    state = synthetic.fleet(nodes=1, allocations=1, baremetal_nodes=0, baremetal_allocations=0)
    assert state.fleet is not None
    state.fleet = m.Fleet.model_validate({**state.fleet.model_dump(by_alias=True), "readiness_timeout_seconds": 45})
    with connections.connect(db_url, autocommit=True) as conn:
        reconciling.reconcile(conn, state)
        plan = hostplans.read(conn, "node-00000")
    assert plan is not None and plan.readiness_timeout_s == 45


FLEET_YAML = """apiVersion: gpuaas.io/v1alpha1
kind: Fleet
name: f
regions:
  - name: r
    pools: [{name: p}]
graceful_timeout_seconds: 45
readiness_timeout_s: 45
"""


def test_an_old_key_warns_at_its_line_naming_the_new_one() -> None:
    result = validation.validate(loading.parse_files([("fleet.yaml", FLEET_YAML.encode())]))
    assert not result.errors
    assert result.state.fleet is not None and result.state.fleet.readiness_timeout_seconds == 45
    said = sorted(w.render() for w in result.warnings)
    assert said == [
        "fleet.yaml:7:1: warning: desired.field.deprecated: graceful_timeout_seconds is deprecated: rename it "
        "readiness_timeout_seconds (same meaning and range)",
        "fleet.yaml:8:1: warning: desired.field.deprecated: readiness_timeout_s is deprecated: rename it "
        "readiness_timeout_seconds (same meaning and range)",
    ]


def test_the_new_key_draws_no_warning() -> None:
    text = FLEET_YAML.split("graceful_", 1)[0] + "readiness_timeout_seconds: 45\n"
    result = validation.validate(loading.parse_files([("fleet.yaml", text.encode())]))
    assert not result.problems
    assert result.state.fleet is not None and result.state.fleet.readiness_timeout_seconds == 45
