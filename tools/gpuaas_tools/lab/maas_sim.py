"""A MAAS simulator: the documented REST API 2.0 surface a lease uses, over real HTTP on 127.0.0.1.

MAAS ships only as a snap and cannot run here, so tests, the kill bench and
the demo's MAAS side talk to this instead, through the same `MaasProvider`.
It checks OAuth1 PLAINTEXT signatures as MAAS does (401 otherwise), takes
multipart/form-data POSTs, and runs the machine state machine the lease
reads:

    Ready -op-allocate-> Allocated -op-deploy-> Deploying -> Deployed | Failed deployment
    Deployed | Failed deployment | Allocated -op-release(erase)-> Releasing -> Disk erasing
        -> Ready | Failed disk erasing

Time moves states forward when a machine is read (no threads). Faults are
set on the object: `fail_deploy`, `fail_erase` (machine ids), `down` (every
request answers 503). It counts every deploy and release per machine, which
is how the kill tests prove "exactly one".
"""

from __future__ import annotations

import base64
import email.message
import email.parser
import json
import re
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

API_KEY = "simconsumer:simtoken:simsecret"


@dataclass
class SimMachine:
    system_id: str
    hostname: str
    ip: str
    status: str = "Ready"
    owner_data: dict[str, str] = field(default_factory=dict)
    owner: str | None = None
    since: float = 0.0
    erase: str = ""
    distro: str = ""
    user_data: str = ""
    message: str = ""

    def payload(self) -> dict[str, Any]:
        return {
            "system_id": self.system_id,
            "hostname": self.hostname,
            "fqdn": f"{self.hostname}.maas",
            "status_name": self.status,
            "status_message": self.message,
            "owner": self.owner,
            "owner_data": dict(self.owner_data),
            "ip_addresses": [self.ip],
            "osystem": "ubuntu",
            "distro_series": self.distro,
            "resource_uri": f"/MAAS/api/2.0/machines/{self.system_id}/",
        }


class MaasSimulator:
    def __init__(
        self, machines: dict[str, str], *, api_key: str = API_KEY, deploy_s: float = 0.2, erase_s: float = 0.2
    ) -> None:
        self.machines = {mid: SimMachine(mid, f"host-{mid}", ip) for mid, ip in machines.items()}
        self.api_key = api_key
        self.deploy_s = deploy_s
        self.erase_s = erase_s
        self.fail_deploy: set[str] = set()
        self.fail_erase: set[str] = set()
        self.down = False
        self.deploys: Counter[str] = Counter()
        self.releases: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.url = ""

    def start(self) -> MaasSimulator:
        sim = self

        class Handler(_Handler):
            simulator = sim

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/MAAS"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> MaasSimulator:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def tick(self, m: SimMachine) -> None:
        """Move a machine along by the time passed (called under the lock)."""
        now = time.monotonic()
        if m.status == "Deploying" and now - m.since >= self.deploy_s:
            if m.system_id in self.fail_deploy:
                m.status, m.message = "Failed deployment", "Installation failed (curtin: disk /dev/sda not found)"
            else:
                m.status, m.message = "Deployed", "Deployed"
            m.since = now
        if m.status == "Releasing" and now - m.since >= self.erase_s / 2:
            m.status, m.since = ("Disk erasing" if m.erase else "Ready"), now
            if m.status == "Ready":
                m.owner, m.owner_data = None, {}
        if m.status == "Disk erasing" and now - m.since >= self.erase_s / 2:
            if m.system_id in self.fail_erase:
                m.status, m.message = "Failed disk erasing", "Failed to erase disks (secure erase not supported)"
            else:
                m.status, m.message, m.owner, m.owner_data = "Ready", "Ready", None, {}
            m.since = now


_OAUTH = re.compile(r'(\w+)="([^"]*)"')
_MACHINE = re.compile(r"^/MAAS/api/2\.0/machines/([A-Za-z0-9._:-]+)/(?:op-([a-z_]+))?$")


class _Handler(BaseHTTPRequestHandler):
    simulator: MaasSimulator

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet: tests read state, not access logs

    def _send(self, code: int, body: Any) -> None:
        raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(body, bytes) else "text/plain")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _authorised(self) -> bool:
        fields = {k: urllib.parse.unquote(v) for k, v in _OAUTH.findall(self.headers.get("Authorization", ""))}
        consumer, token, secret = self.simulator.api_key.split(":")
        return (
            fields.get("oauth_signature_method") == "PLAINTEXT"
            and fields.get("oauth_consumer_key") == consumer
            and fields.get("oauth_token") == token
            and fields.get("oauth_signature") == "&" + secret
            and bool(fields.get("oauth_nonce"))
            and fields.get("oauth_timestamp", "").isdigit()
        )

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("multipart/form-data"):
            msg = email.parser.BytesParser().parsebytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
            out: dict[str, str] = {}
            for part in msg.get_payload():
                if isinstance(part, email.message.Message):
                    raw_part = part.get_payload(decode=True)
                    if isinstance(raw_part, bytes):
                        out[str(part.get_param("name", header="content-disposition"))] = raw_part.decode()
            return out
        return dict(urllib.parse.parse_qsl(raw.decode()))

    def _gate(self) -> bool:
        if self.simulator.down:
            self._send(503, b"MAAS is starting")
            return False
        if not self._authorised():
            self._send(401, b"Authorization Error: 'Expired timestamp' or invalid OAuth signature")
            return False
        return True

    def do_GET(self) -> None:
        if not self._gate():
            return
        sim = self.simulator
        path = urllib.parse.urlparse(self.path).path
        with sim.lock:
            if path == "/MAAS/api/2.0/machines/":
                for each in sim.machines.values():
                    sim.tick(each)
                self._send(200, [each.payload() for each in sim.machines.values()])
                return
            match = _MACHINE.match(path)
            m = sim.machines.get(match.group(1)) if match and not match.group(2) else None
            if m is None:
                self._send(404, b"No Machine matches the given query.")
                return
            sim.tick(m)
            self._send(200, m.payload())

    def do_POST(self) -> None:  # noqa: PLR0911 - one answer per MAAS operation
        if not self._gate():
            return
        sim = self.simulator
        path = urllib.parse.urlparse(self.path).path
        form = self._form()
        with sim.lock:
            if path == "/MAAS/api/2.0/machines/op-allocate":
                found = sim.machines.get(form.get("system_id", ""))
                if found is not None:
                    sim.tick(found)
                if found is None or found.status != "Ready":
                    self._send(409, b"No machine with system ID matching the given constraints is available.")
                    return
                found.status, found.owner, found.since = "Allocated", "gpuaas", time.monotonic()
                self._send(200, found.payload())
                return
            match = _MACHINE.match(path)
            m = sim.machines.get(match.group(1)) if match else None
            if match is None or m is None:
                self._send(404, b"No Machine matches the given query.")
                return
            sim.tick(m)
            op = match.group(2)
            if op == "set_owner_data":
                if m.owner is None:
                    self._send(403, b"Cannot set owner data on a machine that is not allocated.")
                    return
                m.owner_data.update(form)
            elif op == "deploy":
                if m.status != "Allocated":
                    self._send(409, f"Cannot deploy a machine in state {m.status}.".encode())
                    return
                m.distro = form.get("distro_series", "")
                m.user_data = base64.b64decode(form.get("user_data", "")).decode()
                m.status, m.since, m.message = "Deploying", time.monotonic(), "Deploying"
                sim.deploys[m.system_id] += 1
            elif op == "release":
                if m.status not in ("Allocated", "Deploying", "Deployed", "Failed deployment"):
                    self._send(409, f"Cannot release a machine in state {m.status}.".encode())
                    return
                erase = form.get("erase") == "true"
                m.erase = ("secure_erase" if form.get("secure_erase") == "true" else "quick_erase") if erase else ""
                m.status, m.since, m.message = "Releasing", time.monotonic(), "Releasing"
                sim.releases[m.system_id] += 1
            else:
                self._send(400, f"Unrecognised signature: method=POST op={op}".encode())
                return
            self._send(200, m.payload())
