"""The guest marker of seed 002's readiness: the guest says `/var/lib/gpuaas/slice-ready` exists.

Readiness is a DHCP lease of the private IP, TCP 22, and that marker inside
the guest. The host cannot read a guest's filesystem, so the guest tells it:
its seed (`host_reconciler.cloudinit`) installs a small announcer that waits
for the marker and then posts `name=<vm name>&token=<token>` to the host
agent on the management bridge address (`Announcements`, an HTTP listener
the agent runs). The token is an HMAC of the VM name under a per-host secret
kept in the state dir, so only the VM whose seed carries it can mark itself
ready (another VM on the bridge knows its own token only), and the post
must come from the VM's reserved IP. The announcer repeats every minute, so
a restarted agent hears it again without any state of its own.

The same announcer posts the guest's device report to `DEVICES_PATH`
(`host_reconciler.devicereports`: GPU count and UUIDs from nvidia-smi -L or
amd-smi/rocm-smi, the fabric ports' link state), with the same token. A
report with another VM's token, from another address than the VM's reserved
one, oversized or malformed is refused and counted (`refused`), never stored.
Guest GPU telemetry (`host_reconciler.telemetry`) arrives the same way at
`TELEMETRY_PATH`, rate-limited per VM, into a bounded buffer per VM.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import hmac
import os
import re
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from host_reconciler import codes as host_codes
from host_reconciler import devicereports, listening, telemetry
from host_reconciler.drivers import addresses, netns
from host_reconciler.drivers.protocols import GuestAnnounce
from schemas.errors import TemporaryError

PATH = "/v1/slice-ready"
DEVICES_PATH = "/v1/slice-devices"
TELEMETRY_PATH = "/v1/slice-telemetry"
DEFAULT_PORT = 8479
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_MAX_BODY = 1024
MAX_CONNECTIONS = 32  # a host's guests post once a minute each: more at once is a flood
DEADLINE_S = 10.0  # a whole announcement, however slowly it is sent (the per-read timeout alone never ends)
_IP_FREEBIND = 15  # Linux: bind the bridge address before the bridge holds it (socket.IP_FREEBIND, 3.12+)


class ListenError(TemporaryError):
    """The announcement listener could not bind (the port is taken, the namespace is gone)."""

    code = host_codes.READINESS_MARKER_LISTEN


@dataclass(frozen=True, slots=True)
class Heard:
    ip: str  # the address the announcement came from
    at: float  # the listener's clock


@dataclass(frozen=True, slots=True)
class HeardDevices:
    ip: str
    at: float
    devices: devicereports.GuestDevices


def load_secret(path: Path) -> bytes:
    """The host's announcement secret, created (0600, 32 random bytes) on first use."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    data = path.read_bytes()
    if len(data) < 16:
        raise ValueError(f"{path} holds no usable secret")
    return data


class Announcements:
    """An HTTP listener on the management bridge address that records which guests announced their marker."""

    def __init__(
        self,
        secret: bytes | Path,
        *,
        port: int = DEFAULT_PORT,
        netns_name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # A path is read (or created) on first use, not when the agent wires its drivers up.
        self._secret: bytes | None = secret if isinstance(secret, bytes) else None
        self._secret_file = secret if isinstance(secret, Path) else None
        self._port = port
        self._netns = netns.checked(netns_name)
        self._clock = clock
        self._heard: dict[str, Heard] = {}
        self._devices: dict[str, HeardDevices] = {}
        self._expected: dict[str, str] = {}  # VM name -> the reserved IP its reports must come from
        self.refused: dict[str, int] = {}  # device reports and telemetry refused, by reason (never stored)
        # VM name -> (wall time received, listener clock, sample), newest last; bounded per VM and in VMs
        self._telemetry: dict[str, collections.deque[tuple[float, float, telemetry.Sample]]] = {}
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def token(self, name: str) -> str:
        secret = self._secret
        if secret is None and self._secret_file is not None:
            secret = self._secret = load_secret(self._secret_file)
        return hmac.new(secret or b"", name.encode(), hashlib.sha256).hexdigest()[:32]

    def announce_for(self, name: str, gateway: str) -> GuestAnnounce:
        """Listen on `gateway` (the bridge address the guest reaches) and say what the guest must post."""
        if not _NAME.match(name):
            raise ValueError(f"not a VM name: {name!r}")
        address = str(addresses.ipv4(gateway))
        self.listen(address)
        token = self.token(name)
        return GuestAnnounce(
            f"http://{address}:{self.port}{PATH}",
            f"name={name}&token={token}",
            devices_url=f"http://{address}:{self.port}{DEVICES_PATH}",
            devices_head=f"gpuaas-devices 1\nname {name}\ntoken {token}\n",
            telemetry_url=f"http://{address}:{self.port}{TELEMETRY_PATH}",
            telemetry_head=f"gpuaas-telemetry 1\nname {name}\ntoken {token}\n",
        )

    @property
    def port(self) -> int:
        return self._server.server_address[1] if self._server is not None else self._port

    def listen(self, address: str) -> None:
        """Serve on address:port (kept when already there; moved when the address changed)."""
        if self._server is not None and self._server.server_address[0] == address:
            return
        self.close()
        try:
            with netns.entered(self._netns):  # the socket belongs to the namespace it was made in
                server = _Server((address, self._port), _handler(self))
        except OSError as e:
            raise ListenError(
                f"cannot listen for guest markers on {address}:{self._port}: {e.strerror or type(e).__name__}"
            ) from e
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="gpuaas-guest-marker", daemon=True
        )
        self._thread.start()

    def heard(self, name: str) -> Heard | None:
        with self._lock:
            return self._heard.get(name)

    def forget(self, name: str) -> None:
        """Drop a VM's announcement (a new VM of the same name must announce again)."""
        with self._lock:
            self._heard.pop(name, None)
            self._devices.pop(name, None)

    def expect(self, name: str, ip: str) -> None:
        """VM `name`'s device reports must come from `ip` (its reserved address); others are refused."""
        with self._lock:
            self._expected[name] = ip

    def devices(self, name: str) -> HeardDevices | None:
        with self._lock:
            return self._devices.get(name)

    def expect_all(self, expected: dict[str, str]) -> None:
        """The reserved IP of every VM of the plan (each pass): their reports must come from there."""
        with self._lock:
            self._expected.update(expected)

    def record_telemetry(self, body: bytes, ip: str) -> HTTPStatus:
        """One telemetry sample: 204 kept; 400, 413, 403 (token, source) or 429 (too often) refused and counted."""
        try:
            name, token, sample = telemetry.parse(body)
        except telemetry.TelemetryRefused as e:
            return self._refuse(
                f"telemetry.{e.code}",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE if e.code == "oversized" else HTTPStatus.BAD_REQUEST,
            )
        if not hmac.compare_digest(token, self.token(name)):
            return self._refuse(host_codes.TELEMETRY_BAD_TOKEN, HTTPStatus.FORBIDDEN)
        now = self._clock()
        with self._lock:
            expected = self._expected.get(name)
            buf = self._telemetry.get(name)
            last = buf[-1][1] if buf else None
        if expected is None or expected != ip:  # only a VM of the plan, from its own address
            return self._refuse(host_codes.TELEMETRY_WRONG_SOURCE, HTTPStatus.FORBIDDEN)
        if last is not None and now - last < telemetry.MIN_INTERVAL_S:
            return self._refuse(host_codes.TELEMETRY_RATE_LIMITED, HTTPStatus.TOO_MANY_REQUESTS)
        with self._lock:
            if name not in self._telemetry and len(self._telemetry) >= telemetry.MAX_VMS:
                stalest = min(self._telemetry, key=lambda n: self._telemetry[n][-1][1])
                del self._telemetry[stalest]
            self._telemetry.setdefault(name, collections.deque(maxlen=telemetry.BUFFER)).append(
                (time.time(), now, sample)
            )
        return HTTPStatus.NO_CONTENT

    def latest_telemetry(self) -> dict[str, dict[str, object]]:
        """VM name -> its newest sample (received_at: unix time the host got it; buffered: samples kept)."""
        with self._lock:
            return {
                n: {"received_at": b[-1][0], "buffered": len(b), **b[-1][2].as_dict()}
                for n, b in self._telemetry.items()
                if b
            }

    def refused_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.refused)

    def _refuse(self, reason: str, status: HTTPStatus) -> HTTPStatus:
        with self._lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1
        return status

    def record_devices(self, body: bytes, ip: str) -> HTTPStatus:
        """One device report from `ip`: 204 stored; 400 malformed, 413 oversized, 403 token or source refused."""
        try:
            name, token, found = devicereports.parse(body)
        except devicereports.DeviceReportRefused as e:
            return self._refuse(
                e.code, HTTPStatus.REQUEST_ENTITY_TOO_LARGE if e.code == "oversized" else HTTPStatus.BAD_REQUEST
            )
        if not hmac.compare_digest(token, self.token(name)):
            return self._refuse("bad_token", HTTPStatus.FORBIDDEN)
        with self._lock:
            expected = self._expected.get(name)
        if expected is not None and expected != ip:
            return self._refuse("wrong_source", HTTPStatus.FORBIDDEN)
        with self._lock:
            self._devices[name] = HeardDevices(ip, self._clock(), found)
        return HTTPStatus.NO_CONTENT

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def record(self, body: bytes, ip: str) -> HTTPStatus:
        """One announcement from `ip`: 204 recorded, 400 malformed, 403 a token that is not this name's."""
        try:
            form = urllib.parse.parse_qs(body.decode("ascii").strip(), strict_parsing=True, max_num_fields=4)
        except (UnicodeDecodeError, ValueError):
            return HTTPStatus.BAD_REQUEST
        name, token = form.get("name", [""])[0], form.get("token", [""])[0]
        if not _NAME.match(name) or not _TOKEN.match(token):
            return HTTPStatus.BAD_REQUEST
        if not hmac.compare_digest(token, self.token(name)):
            return HTTPStatus.FORBIDDEN
        with self._lock:
            self._heard[name] = Heard(ip, self._clock())
        return HTTPStatus.NO_CONTENT


class _Server(listening.BoundedServer):
    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler, max_connections=MAX_CONNECTIONS, deadline_s=DEADLINE_S)

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IP, _IP_FREEBIND, 1)
        super().server_bind()


def _handler(owner: Announcements) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuaas-guest-marker"
        timeout = 5  # one read; the connection as a whole is cut at DEADLINE_S (`listening.BoundedServer`)

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = 0
            if self.path == DEVICES_PATH:  # the guest's device report (its own, larger cap)
                status = owner.record_devices(
                    self.rfile.read(min(length, devicereports.MAX_BYTES + 1)) if length > 0 else b"",
                    self.client_address[0],
                )
            elif self.path == TELEMETRY_PATH:
                status = owner.record_telemetry(
                    self.rfile.read(min(length, telemetry.MAX_BYTES + 1)) if length > 0 else b"", self.client_address[0]
                )
            elif self.path != PATH:
                status = HTTPStatus.NOT_FOUND
            elif not 0 < length <= _MAX_BODY:
                status = HTTPStatus.BAD_REQUEST
            else:
                status = owner.record(self.rfile.read(length), self.client_address[0])
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # every guest posts every minute: no line per request

    return Handler
