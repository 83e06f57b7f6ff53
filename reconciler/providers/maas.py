"""Canonical MAAS as a machine provider: REST API 2.0 with OAuth1 (PLAINTEXT, as MAAS signs).

The API key is MAAS's `consumer_key:token_key:token_secret`. Deploy is
three calls on `/api/2.0/machines/`: `op-allocate` (system_id), the lease
stamped with `op-set_owner_data` (`gpuaas_allocation`), `op-deploy` with
the image alias (`osystem/distro_series`) and base64 cloud-init user-data.
Release is `op-release` with `erase=true` and `secure_erase` or
`quick_erase` from the node's wipe policy; the machine is `Ready` again
once MAAS erased it, `Failed disk erasing` when it could not.
"""

from __future__ import annotations

import base64
import secrets
import time
import urllib.parse
from typing import Any, NotRequired, TypedDict

from reconciler import codes as reconciler_codes
from reconciler.providers import http
from reconciler.providers.protocols import (
    DeployRequest,
    EraseEvidence,
    Machine,
    MachineState,
    ProviderRefused,
    ReleaseRequest,
)
from schemas.errors import PermanentError

_STATES: dict[str, MachineState] = {
    "Ready": MachineState.READY,
    "Allocated": MachineState.READY,
    "Deploying": MachineState.DEPLOYING,
    "Deployed": MachineState.DEPLOYED,
    "Failed deployment": MachineState.DEPLOY_FAILED,
    "Releasing": MachineState.RELEASING,
    "Disk erasing": MachineState.RELEASING,
    "Failed disk erasing": MachineState.ERASE_FAILED,
    "Failed releasing": MachineState.ERASE_FAILED,
}


class MaasMachine(TypedDict):
    """The fields of MAAS's machine payload this provider reads."""

    system_id: str
    hostname: NotRequired[str]
    status_name: str
    status_message: NotRequired[str | None]
    owner: NotRequired[str | None]
    owner_data: NotRequired[dict[str, str]]
    ip_addresses: NotRequired[list[str]]


def oauth_header(api_key: str) -> str:
    """The Authorization header MAAS expects: OAuth 1.0 with a PLAINTEXT signature ('&' + token secret)."""
    parts = api_key.strip().split(":")
    if len(parts) != 3 or not all(parts):
        raise PermanentError(
            "a MAAS API key has three parts, consumer_key:token_key:token_secret",
            code=reconciler_codes.BAREMETAL_PROVIDER_CREDENTIALS,
        )
    consumer, token, secret = parts
    fields = {
        "oauth_version": "1.0",
        "oauth_signature_method": "PLAINTEXT",
        "oauth_consumer_key": consumer,
        "oauth_token": token,
        "oauth_signature": "&" + urllib.parse.quote(secret, safe=""),
        "oauth_nonce": secrets.token_hex(16),
        "oauth_timestamp": str(int(time.time())),
    }
    return "OAuth " + ", ".join(f'{k}="{urllib.parse.quote(v, safe="&")}"' for k, v in fields.items())


def multipart(fields: dict[str, str]) -> tuple[bytes, str]:
    """MAAS takes POST parameters as multipart/form-data, one part per parameter."""
    boundary = secrets.token_hex(16)
    out = bytearray()
    for k, v in fields.items():
        out += (f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n').encode()
        out += v.encode() + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


class MaasProvider:
    kind = "maas"

    def __init__(self, name: str, url: str, *, api_key: str, timeout: float = 10.0) -> None:
        self.name = name
        self._url = url.rstrip("/") + "/api/2.0"
        self._key = api_key
        self._timeout = timeout
        oauth_header(api_key)  # a malformed key is refused here, before any call

    def __repr__(self) -> str:  # never the key
        return f"MaasProvider({self.name!r}, {self._url!r})"

    def _call(
        self, method: str, path: str, fields: dict[str, str] | None = None, *, missing_ok: bool = False
    ) -> http.Response | None:
        headers = {"Authorization": oauth_header(self._key), "Accept": "application/json"}
        body = None
        if fields is not None:
            body, headers["Content-Type"] = multipart(fields)
        return http.request(
            method,
            f"{self._url}{path}",
            provider=self.name,
            headers=headers,
            body=body,
            timeout=self._timeout,
            missing_ok=missing_ok,
        )

    def machine(self, machine_id: str) -> Machine:
        resp = self._call("GET", f"/machines/{machine_id}/", missing_ok=True)
        if resp is None:
            return Machine(machine_id, MachineState.MISSING, "missing", message="MAAS knows no such machine")
        return _machine(resp.json())

    def machines(self) -> tuple[Machine, ...]:
        resp = self._call("GET", "/machines/")
        return tuple(_machine(m) for m in (resp.json() if resp else []))

    def deploy(self, request: DeployRequest) -> Machine:
        mid = request.machine_id
        now = self.machine(mid)
        if now.provider_state == "Ready":
            self._call("POST", "/machines/op-allocate", {"system_id": mid, "comment": request.allocation_id})
        elif now.provider_state != "Allocated":
            raise ProviderRefused(f"{self.name}: machine {mid} is {now.provider_state}, not Ready")
        self._call("POST", f"/machines/{mid}/op-set_owner_data", {"gpuaas_allocation": request.allocation_id})
        osystem, _, series = request.image.rpartition("/")
        fields = {
            "distro_series": series,
            "user_data": base64.b64encode(request.user_data.encode()).decode(),
            "comment": f"gpuaas lease {request.allocation_id}",
        }
        if osystem:
            fields["osystem"] = osystem
        resp = self._call("POST", f"/machines/{mid}/op-deploy", fields)
        return _machine(resp.json()) if resp else self.machine(mid)

    def release(self, request: ReleaseRequest) -> Machine:
        fields = {"erase": "true", request.wipe_policy: "true", "comment": f"gpuaas release {request.allocation_id}"}
        resp = self._call("POST", f"/machines/{request.machine_id}/op-release", fields)
        return _machine(resp.json()) if resp else self.machine(request.machine_id)

    def erase_evidence(self, machine: Machine, request: ReleaseRequest) -> EraseEvidence:
        ok = machine.provider_state == "Ready"
        return EraseEvidence(machine.machine_id, machine.provider_state, request.wipe_policy, ok, machine.message)


def _machine(data: Any) -> Machine:
    m: MaasMachine = data
    owner = (m.get("owner_data") or {}).get("gpuaas_allocation")
    return Machine(
        m["system_id"],
        _STATES.get(m["status_name"], MachineState.OTHER),
        m["status_name"],
        owner,
        tuple(m.get("ip_addresses") or ()),
        str(m.get("status_message") or ""),
    )
