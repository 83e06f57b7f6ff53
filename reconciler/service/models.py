"""The shape of every JSON document the service sends: pydantic models, from which the OpenAPI document is made.

The read functions (reads.py, usages.py, statuscache.py) build plain dicts;
these models only describe them (`extra="forbid"`: a field a reader adds
must be declared here too, or tests/service/test_openapi.py fails, which is
how the document stays true). Fields are nullable where the store may hold
no value. The agent API's documents live in schemas/agentwire.py (the host
agent decodes them too).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from reconciler.service import portalmodels
from schemas import agentwire

REF = "#/components/schemas/{model}"


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(_Doc):
    code: str
    message: str


class Error(_Doc):
    error: ErrorBody


class Pending(_Doc):
    code: str
    message: str | None
    since: str | None
    details: Any = None


class AllocationSummary(_Doc):
    id: str
    tenant: str
    state: str
    desired_state: Literal["present", "released"]
    present: bool
    region: str
    sku: str
    gpu_count: int
    capacity_shape: str | None
    node: str | None
    slot_indexes: list[int]
    vm_profile: str | None
    image: str | None
    pending: Pending | None
    requested_at: str | None
    placed_at: str | None
    active_at: str | None
    release_requested_at: str | None
    released_at: str | None
    state_changed_at: str | None
    updated_at: str | None


class BootSlot(_Doc):
    slot_index: int | None
    mac_address: str | None
    private_ip: str | None


class Claim(_Doc):
    node: str
    slot_index: int | None
    kind: str
    status: str
    created_at: str | None
    active_at: str | None
    release_requested_at: str | None
    released_at: str | None
    failed_at: str | None


class HostView(_Doc):
    reported_at: str | None
    vm_state: str | None
    phase: str | None
    vm_ready_at: str | None
    error: dict[str, Any] | None
    errors: list[dict[str, Any]]


class Failure(_Doc):
    code: str
    message: str | None
    at: str | None


class Attempt(_Doc):
    attempt: int | None
    node: str | None
    slot_indexes: list[int]
    phase: str | None
    code: str | None
    message: str | None
    outcome: str | None
    quarantined: bool | None
    failed_at: str | None


class Lifecycle(_Doc):
    state: Literal["pending", "reserved", "provisioning", "ready", "releasing", "cleanup", "released", "failed"]
    host_phase: str | None
    host_vm_state: str | None
    boot_ip: str | None
    host_unreachable: bool
    host_reported_at: str | None
    failed_attempts: int
    failure: Failure | None
    attempts: list[Attempt]


class Endpoint(_Doc):
    public_address: str
    public_port: int
    guest_port: int
    private_ip: str | None
    protocol: Literal["tcp"]
    purpose: Literal["ssh", "extra"]


class SshEndpoint(_Doc):
    address: str
    port: int


class BaremetalTimings(_Doc):
    deploy: float | None
    ssh: float | None
    to_active: float | None
    erase: float | None


class Baremetal(_Doc):
    """A whole-node lease through its machine provider (docs/baremetal.md): phase, machine, times, SSH endpoint."""

    node: str
    provider: str
    machine_id: str
    phase: str
    wipe_policy: str
    provider_state: str | None
    provider_message: str | None
    ssh_endpoint: str | None
    wait_code: str | None
    wait_message: str | None
    waiting_since: str | None
    deploy_requested_at: str | None
    deploy_sent_at: str | None
    deployed_at: str | None
    active_at: str | None
    failed_at: str | None
    release_requested_at: str | None
    erase_sent_at: str | None
    erased_at: str | None
    deploy_requests: int
    erase_requests: int
    adopted: int
    erase_evidence: dict[str, Any]
    timings_s: BaremetalTimings


class Allocation(AllocationSummary):
    """One allocation: state and pending reason, placement, boot slot MAC and IP, host phase, claims, timestamps."""

    boot_slot: BootSlot | None
    claims: list[Claim]
    host: HostView | None
    lifecycle: Lifecycle | None
    endpoints: list[Endpoint] = []
    ssh: SshEndpoint | None = None
    baremetal: Baremetal | None = None


class TelemetryGpu(BaseModel):
    model_config = ConfigDict(extra="allow")  # the guest's counters; a field it could not read is null


class Telemetry(_Doc):
    """The guest's newest GPU telemetry, or state unavailable with the reason."""

    allocation_id: str
    allocation_state: str
    state: Literal["available", "unavailable"]
    reason: str | None = None
    node: str | None = None
    received_at: str | None = None
    age_s: float | None = None
    gpus: list[TelemetryGpu] = []


class AllocationPage(_Doc):
    total: int
    offset: int
    limit: int
    items: list[AllocationSummary]


class SlotSummary(_Doc):
    slot_index: int
    state: str
    status: str


class NodeSummary(_Doc):
    name: str
    region: str
    pool: str
    admin_state: str
    capability: str | None
    org: str | None
    baremetal_sku: str | None
    healthy: bool | None
    reported_at: str | None
    leased: bool
    allocations: int
    slots_by_state: dict[str, int]
    slots: list[SlotSummary]
    removed: bool = Field(
        False,
        description="removed from git while live claims remain on it (nothing released them); it takes nothing new",
    )


class NodePage(_Doc):
    total: int
    offset: int
    limit: int
    items: list[NodeSummary]


class DriftFinding(_Doc):
    code: str
    slot_index: int | None
    message: str
    allocation_id: str | None
    expected: str | None
    observed: str | None
    heal: str | None


class NodeFinding(DriftFinding):
    node: str


class NodeHost(_Doc):
    healthy: bool | None
    reported_at: str | None
    observed_generation: int | None
    plan_generation: int | None
    drift_valid: bool
    errors_valid: bool = True
    errors: list[dict[str, Any]]
    agent_version: str | None = None
    reboot_required: bool | None = None
    reboot_reasons: list[str] = []
    bootstrap_state: str | None = None
    bootstrap_checked_at: str | None = None
    firmware: dict[str, Any] | None = None


class SlotClaim(_Doc):
    allocation_id: str
    status: str | None
    tenant: str | None


class SlotHost(_Doc):
    vm_state: str | None
    wipe_state: str | None
    wipe_error: str | None
    updated_at: str | None


class Slot(_Doc):
    slot_index: int
    state: str
    status: str
    gpu_pci_address: str | None
    gpu_model: str | None
    numa_node: int | None
    slot_group: str | None
    nvme_device: str | None
    network_fabric: str | None
    fabric_vf_pci_address: str | None
    mac_address: str | None
    private_ip: str | None
    eligible: bool | None
    ineligible_reasons: list[Any]
    approved: bool | None
    enabled: bool | None
    state_changed_at: str | None
    claim: SlotClaim | None
    host: SlotHost | None
    drift: list[DriftFinding]


class Node(_Doc):
    """One node: slots with state, claims and drift; its host report; its allocations."""

    name: str
    region: str
    pool: str
    admin_state: str
    present: bool
    capability: str | None
    capability_reasons: list[Any]
    org: str | None
    baremetal_sku: str | None
    hardware_tags: list[str]
    profile_tags: list[str]
    revision: str | None
    host: NodeHost | None
    drift: list[DriftFinding]
    slots: list[Slot]
    allocations: list[AllocationSummary]


class Drift(_Doc):
    nodes_reporting: int
    total: int
    findings: list[NodeFinding]
    invalid_reports: list[str]


class Reconciliation(_Doc):
    id: int
    revision: str | None
    source: str | None
    reconciler: str | None
    started_at: str | None
    finished_at: str | None
    seconds: float | None
    result: str | None
    counts: dict[str, Any] | None
    errors: list[Any] | None


class History(_Doc):
    items: list[Reconciliation]


class AllocationUsage(_Doc):
    allocation_id: str
    tenant: str
    sku: str
    claims: int
    gpus: int
    usage_from: str
    usage_to: str
    gpu_hours: float
    gpu_hourly_price_minor: int | None
    currency: str | None
    amount_minor: int


class TenantUsage(_Doc):
    tenant: str
    currency: str | None
    allocations: int
    gpu_hours: float
    amount_minor: int


class Usage(_Doc):
    from_: str = Field(alias="from")
    to: str
    tenant: str | None
    allocations: list[AllocationUsage]
    tenants: list[TenantUsage]


class Reason(_Doc):
    code: str
    message: str


class OfferPrice(_Doc):
    currency: str
    gpu_hourly_minor: int = Field(description="price of one GPU-hour in the currency's minor unit (cents)")


class CapacitySize(_Doc):
    gpu_count: int
    launchable: int
    stranded_gpus: int
    limit: Reason | None = Field(description="why no more of this size can be launched (None: not limited)")
    hourly_price_minor: int | None = Field(
        default=None,
        description="price per hour of one allocation of this "
        "size, in the currency's minor unit (gpu_count x the SKU's GPU-hour price)",
    )


class CapacityOffer(_Doc):
    region: str
    sku: str
    capacity_shape: str
    unit: str
    total: int
    in_use: int
    free: int
    usable: int
    not_launchable: dict[str, Any]
    sizes: list[CapacitySize]
    dedicated: dict[str, Any]
    removed_in_use: int = Field(0, description="units in use on nodes removed from git (counted in total and in_use)")
    price: OfferPrice | None = None


class Capacity(_Doc):
    revision: str | None
    as_of: str
    stale: bool
    computed_in_s: float
    capacity: list[CapacityOffer]


class Index(_Doc):
    endpoints: list[str]


class OpenApiDocument(BaseModel):
    model_config = ConfigDict(extra="allow")
    openapi: str


MODELS: tuple[type[BaseModel], ...] = (
    Error,
    Allocation,
    AllocationPage,
    NodePage,
    Node,
    Drift,
    History,
    Usage,
    Capacity,
    Index,
    OpenApiDocument,
    Telemetry,
    agentwire.PlanAnswer,
    agentwire.ReportAnswer,
    agentwire.HeartbeatAnswer,
    agentwire.StatusReport,
    agentwire.RewipeRequests,
    agentwire.RewipeAnswer,
    agentwire.RewipeAnswered,
    *portalmodels.MODELS,
)


def components() -> dict[str, Any]:
    """Every model above as OpenAPI 3.1 component schemas (JSON Schema 2020-12), referenced by name."""
    _, defs = models_json_schema([(m, "serialization") for m in MODELS], ref_template=REF, by_alias=True)
    return dict(defs.get("$defs", {}))


def ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}
