"""Fleet.max_provision_attempts (provisions that may fail before `failed`) is apart from
placement.max_claim_attempts (candidate nodes tried within one placement after lost races).

The earlier name `max_attempts` is still read, may not disagree with the new one, and draws a
warning naming file:line and the new key.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from desired import models as m
from desired.reading import loading
from policies import validation

BASE: dict[str, Any] = {
    "apiVersion": m.API_VERSION,
    "kind": "Fleet",
    "name": "f",
    "regions": [{"name": "r", "pools": [{"name": "p"}]}],
}


@pytest.mark.parametrize(
    ("given", "attempts"),
    [
        ({}, 3),
        ({"max_provision_attempts": 5}, 5),
        ({"max_attempts": 2}, 2),  # deprecated name
        ({"max_attempts": 4, "max_provision_attempts": 4}, 4),
    ],
)
def test_accepted(given: dict[str, Any], attempts: int) -> None:
    fleet = m.Fleet.model_validate({**BASE, **given})
    assert fleet.max_provision_attempts == attempts
    assert fleet.placement.max_claim_attempts == 5  # the other setting is untouched


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"max_attempts": 0}, "greater than or equal to 1"),
        ({"max_provision_attempts": 21}, "less than or equal to 20"),
        ({"max_attempts": 2, "max_provision_attempts": 3}, "disagree"),
    ],
)
def test_refused(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        m.Fleet.model_validate({**BASE, **given})


def test_the_old_key_warns_at_its_line() -> None:
    text = b"apiVersion: gpuaas.io/v1alpha1\nkind: Fleet\nname: f\nregions: [{name: r, pools: [{name: p}]}]\n"
    result = validation.validate(loading.parse_files([("fleet.yaml", text + b"max_attempts: 2\n")]))
    assert [w.render() for w in result.problems] == [
        "fleet.yaml:5:1: warning: desired.field.deprecated: max_attempts is deprecated: rename it "
        "max_provision_attempts (same meaning and range)"
    ]
    assert result.state.fleet is not None and result.state.fleet.max_provision_attempts == 2
