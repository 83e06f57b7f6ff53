"""The machine-provider contract: what a baremetal lease needs from MAAS or Ironic.

One Protocol for the family, no implementation imported here (as
`host_reconciler.drivers.protocols`). A provider deploys a whole machine
with the tenant's image and SSH keys, reports its state in our closed
vocabulary (`MachineState`), and releases it with an erase. The lease loop
(`reconciler.reconcile.leasing`) is the only caller; it records every request in
PostgreSQL before making it, so a provider call is made once per lease.

Errors are the project's own: `ProviderUnreachable` (temporary: the lease
waits, nothing is released, no second deploy) and `ProviderRefused`
(permanent for this request). Credentials never appear in a message.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Literal, Protocol

from reconciler import codes as reconciler_codes
from schemas.errors import PermanentError, TemporaryError

UNREACHABLE = reconciler_codes.BAREMETAL_PROVIDER_UNREACHABLE
REFUSED = reconciler_codes.BAREMETAL_PROVIDER_REFUSED
CREDENTIALS = reconciler_codes.BAREMETAL_PROVIDER_CREDENTIALS
DEPLOY_FAILED = reconciler_codes.BAREMETAL_DEPLOY_FAILED
ERASE_FAILED = reconciler_codes.BAREMETAL_ERASE_FAILED
MACHINE_MISSING = reconciler_codes.BAREMETAL_MACHINE_MISSING
SSH_WAITING = reconciler_codes.BAREMETAL_SSH_WAITING

WipePolicy = Literal["secure_erase", "quick_erase"]


class ProviderUnreachable(TemporaryError):
    """The provider did not answer, or answered with a server error: try again later."""

    code = UNREACHABLE


class ProviderRefused(PermanentError):
    """The provider refused the request (4xx): repeating it unchanged will not help."""

    code = REFUSED


class MachineState(enum.StrEnum):
    """A machine's state in the lease's terms; `Machine.provider_state` keeps the provider's own word."""

    READY = "ready"  # free for a deploy (MAAS Ready/Allocated, Ironic available)
    DEPLOYING = "deploying"
    DEPLOYED = "deployed"
    DEPLOY_FAILED = "deploy_failed"
    RELEASING = "releasing"  # MAAS Releasing / Disk erasing, Ironic deleting / cleaning
    ERASE_FAILED = "erase_failed"  # MAAS Failed disk erasing / releasing, Ironic clean failed
    MISSING = "missing"  # the provider does not know the machine id
    OTHER = "other"  # commissioning, maintenance, enroll, ...: not ours to drive


@dataclass(frozen=True, slots=True)
class Machine:
    machine_id: str
    state: MachineState
    provider_state: str
    allocation_id: str | None = None  # the lease we stamped on the machine at deploy, as the provider keeps it
    addresses: tuple[str, ...] = ()
    message: str = ""  # the provider's last error or status message


@dataclass(frozen=True, slots=True)
class DeployRequest:
    allocation_id: str
    machine_id: str
    image: str  # the catalog image's source_ref (MAAS alias osystem/release, or an Ironic image URL/alias)
    ssh_keys: tuple[str, ...]
    user_data: str  # cloud-init user-data carrying the SSH keys
    hostname: str


@dataclass(frozen=True, slots=True)
class ReleaseRequest:
    allocation_id: str
    machine_id: str
    wipe_policy: WipePolicy


@dataclass(frozen=True, slots=True)
class EraseEvidence:
    """What the provider says about an erase; recorded as the lease's cleanup proof."""

    machine_id: str
    provider_state: str
    method: str  # secure_erase | quick_erase | automated_clean
    verified: bool
    message: str = ""


class MachineProvider(Protocol):
    """A provider that leases whole machines. Every call may raise ProviderUnreachable or ProviderRefused."""

    name: str
    kind: str

    def machine(self, machine_id: str) -> Machine: ...

    def machines(self) -> tuple[Machine, ...]: ...

    def deploy(self, request: DeployRequest) -> Machine: ...

    def release(self, request: ReleaseRequest) -> Machine: ...

    def erase_evidence(self, machine: Machine, request: ReleaseRequest) -> EraseEvidence: ...


class SshProbe(Protocol):
    """Does something answer TCP on the machine's SSH port (readiness of a deployed machine)."""

    def answers(self, host: str, port: int) -> bool: ...


def cloud_init(ssh_keys: tuple[str, ...], hostname: str) -> str:
    """User-data for a leased machine: the tenant's SSH keys, nothing else of ours."""
    # The keys are quoted as JSON strings, which YAML reads as they are.
    keys = "".join(f"  - {json.dumps(k)}\n" for k in ssh_keys)
    return f"#cloud-config\nhostname: {json.dumps(hostname)}\nssh_authorized_keys:\n{keys}"
