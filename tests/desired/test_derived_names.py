"""Names that break later are refused where they are declared: an allocation id short enough for its VM name."""

from __future__ import annotations

import pytest

from desired import models as m
from desired.reading import loading
from schemas import hostplans

DOC = """apiVersion: gpuaas.io/v1alpha1
kind: Allocation
id: {id}
tenant: acme
sku: h200-sxm-slice
gpu_count: 1
region: us-east-1
requested_at: 2026-11-20T09:00:00Z
"""


def _errors(allocation_id: str) -> list[str]:
    result = loading.parse_files([("a.yaml", DOC.format(id=allocation_id).encode())])
    return [f"{e.code}: {e.message}" for e in result.errors]


def test_the_limit_is_the_hosts_own_vm_name_rule() -> None:
    longest = "a" * m.ALLOCATION_ID_MAX
    assert hostplans.vm_name(longest).startswith(m.VM_NAME_PREFIX)
    assert len(hostplans.vm_name(longest)) == m.DNS_LABEL_MAX
    assert len(hostplans.vm_name(longest + "a")) > m.DNS_LABEL_MAX


@pytest.mark.parametrize("length", [3, 40, 56])
def test_ids_whose_vm_name_fits_validate(length: int) -> None:
    assert _errors("r" * length) == []


@pytest.mark.parametrize("length", [57, 60, 63])
def test_ids_whose_vm_name_would_exceed_a_dns_label_are_refused_naming_the_limit(length: int) -> None:
    assert _errors("r" * length) == [
        f"desired.field.value: field 'id': allocation id is {length} characters; at most 56: its VM name "
        "gpuaas-<id> is a hostname, a DNS label of at most 63 characters"
    ]
