"""OpenStack Ironic as a machine provider, over its REST API (no SDK).

Deploy: stamp the lease on the node (`instance_info.gpuaas_allocation`, the
image, an `instance_uuid` derived from the allocation), then ask for the
`active` provision state with a configdrive carrying the cloud-init
user-data and the SSH keys. Release: the `deleted` target; Ironic tears
down and runs automated cleaning (its erase) before the node is
`available` again; a `clean failed` node is an erase failure.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, NotRequired, TypedDict

from reconciler.providers import http
from reconciler.providers.protocols import (
    DeployRequest,
    EraseEvidence,
    Machine,
    MachineState,
    ReleaseRequest,
)

API_VERSION = "latest"  # configdrive as a JSON object needs 1.56; the standalone service is always current
_LEASE_NS = uuid.UUID("5d0b4f0e-7a52-4c34-9d1f-8f5ac1b0b3a1")

_STATES: dict[str, MachineState] = {
    "available": MachineState.READY,
    "deploying": MachineState.DEPLOYING,
    "wait call-back": MachineState.DEPLOYING,
    "deploy hold": MachineState.DEPLOYING,
    "active": MachineState.DEPLOYED,
    "deploy failed": MachineState.DEPLOY_FAILED,
    "deleting": MachineState.RELEASING,
    "cleaning": MachineState.RELEASING,
    "clean wait": MachineState.RELEASING,
    "clean hold": MachineState.RELEASING,
    "clean failed": MachineState.ERASE_FAILED,
    "error": MachineState.ERASE_FAILED,  # a failed tear-down
}


class IronicNode(TypedDict):
    """The fields of Ironic's node payload this provider reads."""

    uuid: str
    name: NotRequired[str | None]
    provision_state: str
    target_provision_state: NotRequired[str | None]
    last_error: NotRequired[str | None]
    instance_info: NotRequired[dict[str, Any]]
    extra: NotRequired[dict[str, Any]]


class IronicProvider:
    kind = "ironic"

    def __init__(
        self, name: str, url: str, *, token: str | None = None, timeout: float = 10.0, image_base_url: str | None = None
    ) -> None:
        self.name = name
        self._url = url.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._image_base = (image_base_url or "http://images.gpuaas.invalid").rstrip("/")

    def __repr__(self) -> str:  # never the token
        return f"IronicProvider({self.name!r}, {self._url!r})"

    def _call(self, method: str, path: str, body: Any = None, *, missing_ok: bool = False) -> http.Response | None:
        headers = {"X-OpenStack-Ironic-API-Version": API_VERSION, "Accept": "application/json"}
        if self._token:
            headers["X-Auth-Token"] = self._token
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        return http.request(
            method,
            f"{self._url}{path}",
            provider=self.name,
            headers=headers,
            body=data,
            timeout=self._timeout,
            missing_ok=missing_ok,
        )

    def machine(self, machine_id: str) -> Machine:
        resp = self._call("GET", f"/v1/nodes/{machine_id}", missing_ok=True)
        if resp is None:
            return Machine(machine_id, MachineState.MISSING, "missing", message="Ironic knows no such node")
        return self._machine(resp.json(), machine_id)

    def machines(self) -> tuple[Machine, ...]:
        resp = self._call("GET", "/v1/nodes/detail")
        nodes: list[IronicNode] = resp.json()["nodes"] if resp else []
        return tuple(self._machine(n, n.get("name") or n["uuid"]) for n in nodes)

    def _machine(self, node: IronicNode, machine_id: str) -> Machine:
        state = node["provision_state"]
        info = node.get("instance_info") or {}
        extra = node.get("extra") or {}
        mapped = _STATES.get(state, MachineState.OTHER)
        addresses = tuple(str(a) for a in extra.get("addresses", ()) if isinstance(a, str))
        owner = info.get("gpuaas_allocation")
        return Machine(
            machine_id,
            mapped,
            state,
            owner if isinstance(owner, str) else None,
            addresses,
            str(node.get("last_error") or ""),
        )

    def deploy(self, request: DeployRequest) -> Machine:
        image = request.image if "://" in request.image else f"{self._image_base}/{request.image}"
        self._call(
            "PATCH",
            f"/v1/nodes/{request.machine_id}",
            [
                {
                    "op": "add",
                    "path": "/instance_info",
                    "value": {"image_source": image, "gpuaas_allocation": request.allocation_id},
                },
                {"op": "add", "path": "/instance_uuid", "value": str(uuid.uuid5(_LEASE_NS, request.allocation_id))},
            ],
        )
        keys = {str(i): k for i, k in enumerate(request.ssh_keys)}
        self._call(
            "PUT",
            f"/v1/nodes/{request.machine_id}/states/provision",
            {
                "target": "active",
                "configdrive": {
                    "user_data": request.user_data,
                    "meta_data": {"public_keys": keys, "hostname": request.hostname},
                },
            },
        )
        return self.machine(request.machine_id)

    def release(self, request: ReleaseRequest) -> Machine:
        self._call("PUT", f"/v1/nodes/{request.machine_id}/states/provision", {"target": "deleted"})
        return self.machine(request.machine_id)

    def erase_evidence(self, machine: Machine, request: ReleaseRequest) -> EraseEvidence:
        # Ironic erases in automated cleaning; which steps run is Ironic's configuration
        # (erase_devices for secure, erase_devices_metadata for quick), the policy asked is recorded.
        ok = machine.state is MachineState.READY and not machine.message
        return EraseEvidence(machine.machine_id, machine.provider_state, "automated_clean", ok, machine.message)
