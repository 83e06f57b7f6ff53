"""The host's own report (seed 003 sections 1-2): firmware evidence, bootstrap state, agent version.

Shared by the host agent, which builds it each pass and writes it into
`host_status` (`firmware_ready` column, `details.host`), and the service,
which reads `details.host` back for the node API, the dashboard and
/metrics. Codes are stable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from schemas import codes as schemas_codes

# firmware_ready is None only when the host has no evidence directory: the git
# onboarding claim (Node.firmware_profile.ready) then stands.
FIRMWARE_NO_EVIDENCE = schemas_codes.HOST_FIRMWARE_NO_EVIDENCE
FIRMWARE_INVALID = schemas_codes.HOST_FIRMWARE_EVIDENCE_INVALID
FIRMWARE_NOT_VERIFIED = schemas_codes.HOST_FIRMWARE_NOT_VERIFIED
FIRMWARE_MISMATCH = schemas_codes.HOST_FIRMWARE_ATTRIBUTE_MISMATCH
FIRMWARE_READY = schemas_codes.HOST_FIRMWARE_READY

BOOTSTRAP_NEVER = "never_run"  # no state file: bootstrap never ran on this host
BOOTSTRAP_STATES = ("ready", "changes_pending", "reboot_required", "blocked", "failed", BOOTSTRAP_NEVER)


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class HostReport:
    agent_version: str
    firmware_ready: bool | None
    firmware_code: str
    firmware_evidence: Mapping[str, Any] = field(default_factory=_empty)
    bootstrap_state: str = BOOTSTRAP_NEVER
    bootstrap_checked_at: str | None = None
    reboot_required: bool = False
    reboot_reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent_version": self.agent_version,
            "firmware_ready": self.firmware_ready,
            "firmware_code": self.firmware_code,
            "firmware_evidence": dict(self.firmware_evidence),
            "bootstrap_state": self.bootstrap_state,
            "bootstrap_checked_at": self.bootstrap_checked_at,
            "reboot_required": self.reboot_required,
            "reboot_reasons": list(self.reboot_reasons),
        }


def from_dict(doc: Mapping[str, Any] | None) -> HostReport | None:
    """Read `details.host` back (None when the host never sent one, or it does not decode)."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("agent_version"), str):
        return None
    ready = doc.get("firmware_ready")
    evidence = doc.get("firmware_evidence")
    reasons = doc.get("reboot_reasons")
    state = doc.get("bootstrap_state")
    checked = doc.get("bootstrap_checked_at")
    return HostReport(
        agent_version=str(doc["agent_version"])[:64],
        firmware_ready=ready if isinstance(ready, bool) else None,
        firmware_code=str(doc.get("firmware_code") or FIRMWARE_NO_EVIDENCE)[:64],
        firmware_evidence=evidence if isinstance(evidence, dict) else {},
        bootstrap_state=state if state in BOOTSTRAP_STATES else BOOTSTRAP_NEVER,
        bootstrap_checked_at=str(checked) if checked is not None else None,
        reboot_required=doc.get("reboot_required") is True,
        reboot_reasons=tuple(str(r)[:200] for r in reasons[:16]) if isinstance(reasons, list) else (),
    )
