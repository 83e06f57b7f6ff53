"""The agent API's wire: paths, error codes, and the documents a host agent and the service exchange.

Shared by the host agent's HTTP client (host_reconciler/agentclient.py) and
the service (reconciler/service/agents.py), so neither imports the other.

    GET  /api/v1/agent/nodes/{node}/plan?after=G&wait=S   the node's plan; with `after`, waits
         (long-poll, at most `wait` seconds) until the plan's generation differs from G
    POST /api/v1/agent/nodes/{node}/heartbeat              the agent is alive (batched by the service)
    POST /api/v1/agent/nodes/{node}/reports/{kind}         one report; `status` today (HostStatus.as_dict():
         node and slot state, VMs, drift, errors, image cache, guest-marker readiness, guest GPU telemetry)
    GET  /api/v1/agent/nodes/{node}/rewipes                the node's pending `gpuaas slot rewipe` requests
    POST /api/v1/agent/nodes/{node}/rewipes/{id}           the agent's answer to one (accepted | refused)

Every request carries `Authorization: Bearer <node token>`; a token names
one node and is refused (403 `agent.forbidden`) for any other node's path.
A new report kind is one entry in REPORT_KINDS here and one writer in the
service.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import codes as schemas_codes

PREFIX = "/api/v1/agent"
TOKEN_PREFIX = "gpuaas-node-"  # noqa: S105 - the visible prefix of a node token, not a secret
MAX_WAIT_S = 50.0  # a watch never outlives the service's per-request time limit
MAX_REPORT_BYTES = 4 * 1024 * 1024

# Stable codes (never change the strings: agents and dashboards match on them).
UNAUTHORIZED = schemas_codes.AGENT_UNAUTHORIZED  # no node token, or one the service does not know
FORBIDDEN = schemas_codes.AGENT_FORBIDDEN  # a valid token for another node than the path names
REPORT_INVALID = schemas_codes.AGENT_REPORT_INVALID  # a report of the wrong shape (or refused by the database's checks)
REPORT_STALE = schemas_codes.AGENT_REPORT_STALE  # a report older than the one stored: ignored, nothing written
REPORT_KIND_UNKNOWN = schemas_codes.AGENT_REPORT_KIND_UNKNOWN
TOO_LARGE = schemas_codes.AGENT_REPORT_TOO_LARGE
REWIPE_NOT_FOUND = schemas_codes.AGENT_REWIPE_NOT_FOUND  # no such request for this node (another node's is not seen)
REWIPE_ANSWERED = schemas_codes.AGENT_REWIPE_ANSWERED  # the request was answered already; nothing written
CODES = (
    UNAUTHORIZED,
    FORBIDDEN,
    REPORT_INVALID,
    REPORT_STALE,
    REPORT_KIND_UNKNOWN,
    TOO_LARGE,
    REWIPE_NOT_FOUND,
    REWIPE_ANSWERED,
)

REPORT_KINDS = ("status",)


def plan_path(node: str) -> str:
    return f"{PREFIX}/nodes/{node}/plan"


def heartbeat_path(node: str) -> str:
    return f"{PREFIX}/nodes/{node}/heartbeat"


def report_path(node: str, kind: str) -> str:
    return f"{PREFIX}/nodes/{node}/reports/{kind}"


def rewipes_path(node: str) -> str:
    return f"{PREFIX}/nodes/{node}/rewipes"


def rewipe_path(node: str, request_id: int) -> str:
    return f"{PREFIX}/nodes/{node}/rewipes/{request_id}"


class PlanAnswer(BaseModel):
    """The answer to a plan read or watch."""

    model_config = ConfigDict(extra="forbid")
    node: str
    generation: int | None = Field(description="the plan's generation (None: no plan for this node yet)")
    changed: bool = Field(description="false: the watch timed out and the plan is still generation `after`")
    plan: dict[str, Any] | None = Field(
        description="the host plan document (schemas/hostplans.py), omitted when unchanged"
    )


class ReportAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str
    kind: str
    written: bool = Field(description="false: a newer report was stored already; this one was ignored")
    stored_generation: int | None = None


class HeartbeatAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str
    accepted: bool


class RewipeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=1)
    slot_index: int = Field(ge=0)


class RewipeRequests(BaseModel):
    """This node's pending `gpuaas slot rewipe` requests (0054), oldest first."""

    model_config = ConfigDict(extra="forbid")
    node: str
    requests: list[RewipeRequest]


class RewipeAnswer(BaseModel):
    """The agent's answer to one request (host_reconciler/rewiping.py)."""

    model_config = ConfigDict(extra="forbid")
    state: Literal["accepted", "refused"]
    answer: dict[str, Any] = Field(default_factory=dict, description="why (for refused: code and message)")


class RewipeAnswered(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node: str
    id: int
    state: Literal["accepted", "refused"]


class SlotReport(BaseModel):
    """One slot of a status report; the database checks the contents (0008)."""

    model_config = ConfigDict(extra="allow")
    slot_index: int = Field(ge=0, le=255)
    state: str | None = None
    allocation_id: str | None = None
    vm_state: str | None = None
    vm_ready_at: str | None = None
    wipe_allocation_id: str | None = None
    wipe_state: str | None = None
    wipe_evidence: dict[str, Any] = Field(default_factory=dict)
    wipe_error: str | None = None
    phase_timings: dict[str, float] = Field(default_factory=dict)
    drift: list[dict[str, Any]] = Field(default_factory=list)


class StatusReport(BaseModel):
    """A host's status after a pass (`HostStatus.as_dict()`)."""

    model_config = ConfigDict(extra="allow")
    node: str
    generation: int = Field(ge=0)
    observed_generation: int = Field(ge=0)
    healthy: bool | None = None
    slots: list[SlotReport] = Field(default_factory=list, max_length=256)
    vms: list[dict[str, Any]] = Field(default_factory=list)
    drift: list[dict[str, Any]] = Field(default_factory=list)
    errors: list[dict[str, Any]] = Field(default_factory=list)
    images: dict[str, Any] = Field(default_factory=dict)
    telemetry: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        max_length=256,
        description="allocation -> the guest's newest GPU sample (received_at: unix seconds; 0056)",
    )
