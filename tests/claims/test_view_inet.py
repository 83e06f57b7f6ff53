"""`views.desired_state` reads a slot's private_ip as text (host() when a single address, else the
inet's text) and prints it as psycopg's inet loader did: the same string for every form."""

from __future__ import annotations

import ipaddress

import pytest

from reconciler.store import views


def _as_loader_printed(text: str) -> str:
    return str(ipaddress.ip_interface(text) if "/" in text else ipaddress.ip_address(text))


@pytest.mark.parametrize(
    "text", ["10.0.0.7", "192.168.255.254", "fd00::1", "2001:db8:0:0:0:0:0:1", "::ffff:10.0.0.1", "10.0.0.7/24"]
)
def test_a_private_ip_prints_as_the_inet_loader_printed_it(text: str) -> None:
    assert views._ip_text(text) == _as_loader_printed(text)
