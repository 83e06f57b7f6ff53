"""Host settings refuse a port that cannot be one (readiness and the guest marker listener)."""

from __future__ import annotations

import pytest

from host_reconciler import settings


@pytest.mark.parametrize("key", ["readiness_port", "guest_marker_port"])
@pytest.mark.parametrize("value", [0, 65536, -1, "8479", True, 1.5])
def test_a_bad_port_is_refused(key: str, value: object) -> None:
    with pytest.raises(settings.SettingsError, match=key):
        settings.from_dict("n1", {key: value})


def test_the_marker_port_is_taken_as_given() -> None:
    assert settings.from_dict("n1", {"guest_marker_port": 18479}).guest_marker_port == 18479
    assert settings.from_dict("n1", {}).guest_marker_port == 8479
