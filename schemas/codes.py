"""Stable codes both agents share: database refusals, the agent wire, snapshots, base errors.

Codes are part of the product's interface: operators, CI jobs and the portal match on them.
Do not change the string values. Once set, they are set. Each constant has its one-line meaning
above it; docs/error-codes.md is generated from these lines (python -m tests.errorcodes --write).
"""

from __future__ import annotations

# a valid token for another node than the path names
AGENT_FORBIDDEN = "agent.forbidden"
# a report of the wrong shape (or refused by the database's checks)
AGENT_REPORT_INVALID = "agent.report_invalid"
# a host agent posted a report of a kind the service does not know
AGENT_REPORT_KIND_UNKNOWN = "agent.report_kind_unknown"
# a report older than the one stored: ignored, nothing written
AGENT_REPORT_STALE = "agent.report_stale"
# a host agent's report is larger than the limit
AGENT_REPORT_TOO_LARGE = "agent.report_too_large"
# the request was answered already; nothing written
AGENT_REWIPE_ANSWERED = "agent.rewipe_answered"
# no such request for this node (another node's is not seen)
AGENT_REWIPE_NOT_FOUND = "agent.rewipe_not_found"
# no node token, or one the service does not know
AGENT_UNAUTHORIZED = "agent.unauthorized"
# the database refused a claim: the allocation is not pending (a lost race)
CLAIM_ALLOCATION_NOT_PENDING = "claim.allocation_not_pending"
# the database refused a claim: the allocation holds claims on another node
CLAIM_ALLOCATION_OTHER_NODE = "claim.allocation_other_node"
# the database refused a claim status change that is not allowed
CLAIM_BAD_TRANSITION = "claim.bad_transition"
# the database refused a claim created in a status other than reserved
CLAIM_CREATED_NOT_LIVE = "claim.created_not_live"
# the database refused an edit of a claim's fixed fields
CLAIM_IMMUTABLE = "claim.immutable"
# the database refused a claim whose kind does not fit its slot (slice) or node (baremetal)
CLAIM_KIND_SHAPE = "claim.kind_shape"
# the database refused to delete a claim (claims are kept as history)
CLAIM_NO_DELETE = "claim.no_delete"
# the database refused a claim on a node where the allocation failed before
CLAIM_NODE_FAILED_BEFORE = "claim.node_failed_before"
# the database refused a claim: the node is not claimable (draining, unavailable, ...)
CLAIM_NODE_NOT_CLAIMABLE = "claim.node_not_claimable"
# the database refused a claim that overlaps a whole-node claim (a lost race)
CLAIM_NODE_OVERLAP = "claim.node_overlap"
# the database refused to release a claim without cleanup proof
CLAIM_RELEASE_NEEDS_PROOF = "claim.release_needs_proof"
# the database refused a claim: the slot is not available (a lost race)
CLAIM_SLOT_NOT_CLAIMABLE = "claim.slot_not_claimable"
# the database refused a claim on a slot of another node
CLAIM_SLOT_OF_OTHER_NODE = "claim.slot_of_other_node"
# the database refused a claim: the slot holds a live claim (a lost race)
CLAIM_SLOT_TAKEN = "claim.slot_taken"
# …=…: the log format is one of …
CLI_LOG_FORMAT_UNKNOWN = "cli.log_format_unknown"
# the command line is wrong (an option, an argument)
CLI_USAGE = "cli.usage"
# a concurrent transaction conflicted (serialization or deadlock): retried
DB_CONFLICT = "db.conflict"
# the database refused a write that would break an invariant
DB_CONSTRAINT = "db.constraint"
# the database failed a statement for a reason that is not a refusal
DB_ERROR = "db.error"
# PostgreSQL cannot be reached
DB_UNAVAILABLE = "db.unavailable"
# an error with no more specific code (a bug if seen)
GPUAAS_ERROR = "gpuaas.error"
# the host's firmware evidence disagrees with the node's firmware profile
HOST_FIRMWARE_ATTRIBUTE_MISMATCH = "host.firmware.attribute_mismatch"
# the host's firmware evidence file is malformed
HOST_FIRMWARE_EVIDENCE_INVALID = "host.firmware.evidence_invalid"
# the host has no firmware evidence; the git onboarding claim stands
HOST_FIRMWARE_NO_EVIDENCE = "host.firmware.no_evidence"
# the host's firmware evidence is not verified
HOST_FIRMWARE_NOT_VERIFIED = "host.firmware.not_verified"
# the host's firmware evidence is verified and matches (not an error)
HOST_FIRMWARE_READY = "host.firmware.ready"
# the database refused an endpoint: the guest port of the allocation is exposed already
INGRESS_GUEST_PORT_TAKEN = "ingress.guest_port_taken"
# the database refused to delete an endpoint (endpoints are kept as history)
INGRESS_NO_DELETE = "ingress.no_delete"
# the database refused an endpoint: the public port is taken (a lost race)
INGRESS_PORT_TAKEN = "ingress.port_taken"
# the node's ingress port range is full
INGRESS_PORTS_EXHAUSTED = "ingress.ports_exhausted"
# the database refused a slot marked claimed with no live claim
SLOT_CLAIMED_WITHOUT_CLAIM = "slot.claimed_without_claim"
# the database refused a slot marked available while a claim holds it
SLOT_FREE_WITH_LIVE_CLAIM = "slot.free_with_live_claim"
# a claim snapshot's profile holds a value of the wrong type or range
SNAPSHOT_PROFILE_BAD_VALUE = "snapshot.profile.bad_value"
# a claim snapshot's profile lacks a key
SNAPSHOT_PROFILE_MISSING_KEY = "snapshot.profile.missing_key"
# a slot claim (a VM) whose snapshot records no profile
SNAPSHOT_PROFILE_NONE = "snapshot.profile.none"
# a claim snapshot's profile is not a JSON object
SNAPSHOT_PROFILE_NOT_OBJECT = "snapshot.profile.not_object"
# a claim snapshot's profile has a key this version does not know
SNAPSHOT_PROFILE_UNKNOWN_KEY = "snapshot.profile.unknown_key"
# …; reinstall the tools: pip install '…'
CLI_TOOL_UNAVAILABLE = "cli.tool_unavailable"
# gpuaas: commands
GPUAAS_COMMANDS = "gpuaas.commands"
# snapshot: claim bad value
SNAPSHOT_CLAIM_BAD_VALUE = "snapshot.claim.bad_value"
# snapshot: claim missing key
SNAPSHOT_CLAIM_MISSING_KEY = "snapshot.claim.missing_key"
# snapshot: claim not object
SNAPSHOT_CLAIM_NOT_OBJECT = "snapshot.claim.not_object"
# snapshot: claim unknown key
SNAPSHOT_CLAIM_UNKNOWN_KEY = "snapshot.claim.unknown_key"
# the stored report was malformed: nothing it says can be trusted
DRIFT_REPORT_INVALID = "drift.report.invalid"
