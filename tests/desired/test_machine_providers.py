"""Declared machine providers (issue 30) on the example fleet: each rule at the line of the field it names."""

from __future__ import annotations

from desired import problems as p
from tests.desired.test_image_rules import line_of, problems

FLEET_FILE = "fleet.yaml"
B02 = "nodes/h200-use1-b02.yaml"
B01 = "nodes/h200-use1-b01.yaml"


def test_the_example_fleet_names_a_provider_for_every_baremetal_capable_node() -> None:
    assert problems({}) == []


def test_an_undeclared_provider_is_refused_at_its_line() -> None:
    found = problems({B02: ("provider: ironic-use1", "provider: ironic-nowhere")})
    assert found == [(B02, line_of(B02, "  provider:"), p.NODE_MACHINE_PROVIDER)]


def test_one_machine_serves_one_node() -> None:
    found = problems({B02: ("machine_id: h200-use1-b02", "machine_id: h200-use1-b01")})
    assert found == [(B02, line_of(B02, "  machine_id:"), p.NODE_MACHINE_DUPLICATE)] or found == [
        (B01, line_of(B01, "  machine_id:"), p.NODE_MACHINE_DUPLICATE)
    ]


def test_a_secret_written_into_git_is_refused() -> None:
    found = problems(
        {FLEET_FILE: ("credentials: {env: GPUAAS_MAAS_EUW1_KEY}", "credentials: {api_key: 'ck:tk:secret'}")}
    )
    # The Fleet document is refused at the credentials line (and what needs it reports it missing).
    mine = [(line, code) for f, line, code in found if f == FLEET_FILE]
    assert mine and mine[0][1].startswith("desired.field.")
    assert mine[0][0] in (line_of(FLEET_FILE, "    credentials:"), line_of(FLEET_FILE, "    credentials:") + 1)


def test_a_duplicate_provider_name_is_refused() -> None:
    found = problems({FLEET_FILE: ("  - name: maas-euw1", "  - name: ironic-use1")})
    # The euw1 nodes now name a provider that no longer exists: each says so at its own line.
    assert found[0] == (FLEET_FILE, line_of(FLEET_FILE, "  - name: maas-euw1"), p.PROVIDER_DUPLICATE)
    assert {c for _, _, c in found[1:]} == {p.NODE_MACHINE_PROVIDER}
