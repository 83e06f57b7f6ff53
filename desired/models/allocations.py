"""Allocations: what a tenant asked for, by the portal bot or an operator."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    Strict,
    field_validator,
)

from desired.models.base import AllocationState, Name, Timestamp, _Doc
from desired.patterns import SSH_KEY_RE

# ----------------------------------------------------------------- Allocation


# The host names a slice VM `gpuaas-<allocation id>` (schemas.hostplans.vm_name): libvirt domain,
# cloud-init hostname and DHCP reservation name. A hostname label is at most 63 characters (RFC 1035), so
# the id must leave room for the prefix; checked here, where the id is declared, not at provision time.
VM_NAME_PREFIX = "gpuaas-"
DNS_LABEL_MAX = 63
ALLOCATION_ID_MAX = DNS_LABEL_MAX - len(VM_NAME_PREFIX)


class Allocation(_Doc):
    kind: Literal["Allocation"]
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{2,62}$", json_schema_extra={"maxLength": ALLOCATION_ID_MAX})]
    tenant: Name
    sku: Name
    gpu_count: int = Field(ge=1, le=8)
    region: Name
    image: Name | None = None
    ssh_keys: Annotated[tuple[Annotated[str, Field(pattern=SSH_KEY_RE)], ...], Strict(False)] = ()
    vm_profile: Name | None = None
    state: Annotated[AllocationState, Strict(False)] = AllocationState.PRESENT
    requested_at: Timestamp
    lease_hours: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Reserved term the customer bought, in hours, as the portal sends it (a product term, not an "
        "estimate): the lease ends lease_hours after requested_at. Absent for on-demand leases, which "
        "run until released. The default placement policy co-locates leases that end around the same "
        "time, so hosts empty together for whole-node requests (docs/placement.md).",
    )
    extra_ports: Annotated[tuple[Annotated[int, Field(ge=1, le=65535)], ...], Strict(False)] = Field(
        default=(),
        description="Guest TCP ports to expose besides SSH (22, always exposed), each on its own public port of "
        "the node's ingress range; at most the Fleet's ingress.max_extra_ports, no repeats.",
    )

    @field_validator("id")
    @classmethod
    def _id_fits_derived_names(cls, value: str) -> str:
        if len(value) > ALLOCATION_ID_MAX:
            raise ValueError(
                f"allocation id is {len(value)} characters; at most {ALLOCATION_ID_MAX}: its VM name "
                f"{VM_NAME_PREFIX}<id> is a hostname, a DNS label of at most {DNS_LABEL_MAX} characters"
            )
        return value
