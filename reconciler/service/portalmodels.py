"""Pydantic models of the portal's paths (intake, catalog, events): the OpenAPI document is generated from them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from desired import codes as desired_codes
from reconciler import codes as reconciler_codes

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa alice@laptop"


class AllocationRequest(BaseModel):
    """What the portal sends; ranges and names are checked by `gpuaas validate`'s rules (422), not here."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "tenant": "globex",
                    "sku": "h200-sxm-slice",
                    "region": "us-east-1",
                    "gpu_count": 2,
                    "image": "h200-ubuntu-24.04-gpuaas-slice",
                    "ssh_keys": [KEY],
                    "lease_hours": 72,
                }
            ]
        },
    )

    id: str | None = Field(default=None, description="allocation id (default: req-YYYYMMDD-<random>)")
    tenant: str | None = Field(default=None, description="the tenant (with a tenant token: its own; may be omitted)")
    sku: str
    region: str
    gpu_count: int
    image: str | None = Field(default=None, description="an image of GET /images?sku= (default: the SKU's)")
    vm_profile: str | None = Field(default=None, description="one of the SKU's vm_profiles (default: the SKU's)")
    ssh_keys: list[str] = Field(default_factory=list, description="OpenSSH public key lines")
    lease_hours: float | None = Field(default=None, description="reserved term; absent: on demand until released")


class Accepted(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "id": "req-20261127-1a2b3c4d",
                    "tenant": "globex",
                    "state": "present",
                    "commit": "5f0c2e1d9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d",
                    "pushed_to": "origin/main",
                    "location": "/api/v1/allocations/req-20261127-1a2b3c4d",
                }
            ]
        },
    )

    id: str
    tenant: str
    state: str = Field(description="the desired state committed: present, or released")
    commit: str = Field(description="the portal bot's commit in the desired-state repo")
    pushed_to: str | None = Field(description="REMOTE/BRANCH the commit was pushed to (None: not pushed)")
    location: str


class IntakeProblem(BaseModel):
    code: str
    message: str
    file: str | None
    line: int | None
    column: int | None
    severity: str


class IntakeErrorBody(BaseModel):
    code: str
    message: str
    problems: list[IntakeProblem] | None = Field(default=None, description="request.invalid: as `gpuaas validate`")


class IntakeError(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "error": {
                        "code": reconciler_codes.REQUEST_INVALID,
                        "message": "the request would make the desired state invalid; nothing was written",
                        "problems": [
                            {
                                "code": desired_codes.REF_UNRESOLVED,
                                "message": "unknown image 'no-such-image'",
                                "file": "allocations/req-20261127-1a2b3c4d.yaml",
                                "line": 9,
                                "column": 8,
                                "severity": "error",
                            }
                        ],
                    }
                }
            ]
        }
    )
    error: IntakeErrorBody


class VmProfileEntry(BaseModel):
    name: str
    gpu_count: int
    vcpu_count: int
    memory_mib: int
    default: bool


class SkuPrice(BaseModel):
    currency: str
    gpu_hourly_minor: int = Field(description="one GPU-hour in the currency's minor unit (cents)")
    hourly_minor_by_gpu_count: dict[str, int] = Field(description="GPU count -> hourly price of that allocation")


class SkuEntry(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "sku": "h200-sxm-slice",
                    "display_name": "H200 SXM (VM slice)",
                    "capacity_shape": "gpu_slice",
                    "accelerator": {"vendor": "nvidia", "model": "h200-sxm"},
                    "network_fabric": "infiniband",
                    "gpu_counts": [1, 2, 4, 8],
                    "exclusive_node": False,
                    "vm_profiles": [],
                    "price": {
                        "currency": "USD",
                        "gpu_hourly_minor": 399,
                        "hourly_minor_by_gpu_count": {"1": 399, "2": 798},
                    },
                    "default_image": "h200-ubuntu-24.04-gpuaas-slice",
                }
            ]
        }
    )
    sku: str
    display_name: str
    capacity_shape: str
    accelerator: dict[str, str]
    network_fabric: str
    gpu_counts: list[int]
    exclusive_node: bool
    vm_profiles: list[VmProfileEntry]
    price: SkuPrice
    default_image: str | None


class SkuCatalog(BaseModel):
    items: list[SkuEntry]


class ImageEntry(BaseModel):
    slug: str
    display_name: str
    version: str
    family: str
    architecture: str
    target: str
    default_username: str
    skus: list[str] = Field(description="the SKUs this image can boot (of those asked for)")


class ImageCatalog(BaseModel):
    items: list[ImageEntry]


class AllocationEvent(BaseModel):
    """One server-sent event's data (the SSE `id:` is `outbox_id`, the `event:` is `event_type`)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "outbox_id": 1042,
                    "event_type": "allocation.reserved",
                    "allocation_id": "req-20261127-1a2b3c4d",
                    "tenant": "globex",
                    "state": "reserved",
                    "at": "2026-11-27T16:20:00+00:00",
                    "payload": {},
                }
            ]
        }
    )
    outbox_id: int
    event_type: str
    allocation_id: str
    tenant: str | None
    state: str | None = Field(description="the allocation's state the event announces, where it names one")
    at: str
    payload: dict[str, Any]


MODELS: tuple[type[BaseModel], ...] = (
    AllocationRequest,
    Accepted,
    IntakeError,
    SkuCatalog,
    ImageCatalog,
    AllocationEvent,
)
