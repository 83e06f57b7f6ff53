"""A standalone Ironic on 127.0.0.1 for tests, the demo and benches (fake-hardware, sqlite, noauth).

`make deps` installs Ironic into its own venv (`.venv/ironic`, beside the
project venv and outside the state dir, or $GPUAAS_IRONIC_VENV). `IronicService` writes a config, creates the sqlite
schema, starts the all-in-one `ironic` process (API and conductor, no
message bus) and enrolls machines through the real state machine:
enroll -> manage -> provide (cleaning) -> available.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

ENV_VENV = "GPUAAS_IRONIC_VENV"

_CONFIG = """\
[DEFAULT]
auth_strategy = noauth
rpc_transport = none
enabled_hardware_types = fake-hardware
enabled_boot_interfaces = fake
enabled_deploy_interfaces = fake
enabled_management_interfaces = fake
enabled_power_interfaces = fake
enabled_inspect_interfaces = no-inspect
enabled_console_interfaces = no-console
enabled_raid_interfaces = no-raid
enabled_rescue_interfaces = no-rescue
enabled_vendor_interfaces = no-vendor
enabled_bios_interfaces = no-bios
enabled_network_interfaces = noop
enabled_storage_interfaces = noop
default_network_interface = noop
host = gpuaas-lab
log_file = {dir}/ironic.log
use_stderr = false
[api]
host_ip = 127.0.0.1
port = {port}
[database]
connection = sqlite:///{dir}/ironic.sqlite
[dhcp]
dhcp_provider = none
[conductor]
automated_clean = true
sync_power_state_interval = -1
periodic_max_workers = 2
[oslo_concurrency]
lock_path = {dir}/locks
"""


def venv(repo: Path | None = None) -> Path | None:
    """The Ironic venv, or None when it is not installed."""
    env = os.environ.get(ENV_VENV)
    candidates = [Path(env)] if env else []
    root = repo or Path(__file__).resolve().parents[3]
    candidates.append(root / ".venv" / "ironic")
    for c in candidates:
        if (c / "bin" / "ironic").exists() and (c / "bin" / "ironic-dbsync").exists():
            return c
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class IronicService:
    def __init__(self, workdir: Path, *, venv_dir: Path, port: int | None = None) -> None:
        self.dir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._venv = venv_dir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> IronicService:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "locks").mkdir(exist_ok=True)
        conf = self.dir / "ironic.conf"
        conf.write_text(_CONFIG.format(dir=self.dir, port=self.port))
        subprocess.run(
            [str(self._venv / "bin" / "ironic-dbsync"), f"--config-file={conf}", "create_schema"],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        with (self.dir / "ironic.out").open("wb") as out:  # the child keeps its own copy of the descriptor
            self._proc = subprocess.Popen(
                [str(self._venv / "bin" / "ironic"), f"--config-file={conf}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"ironic exited {self._proc.returncode}; see {self.dir}/ironic.out")
            try:
                self.call("GET", "/v1")
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"ironic did not answer on {self.url} within {timeout:.0f} s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> IronicService:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={
                "X-OpenStack-Ironic-API-Version": "latest",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - our own http://127.0.0.1 service
            raw = resp.read()
        return json.loads(raw) if raw else None

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/nodes/{name}"))

    def enroll(self, names: list[str], *, addresses: dict[str, str] | None = None, timeout: float = 120.0) -> None:
        """Enroll fake-hardware machines and bring each through manage and provide (cleaning) to available."""
        for name in names:
            extra = {"addresses": [addresses[name]]} if addresses and name in addresses else {}
            self.call(
                "POST",
                "/v1/nodes",
                {
                    "name": name,
                    "driver": "fake-hardware",
                    "boot_interface": "fake",
                    "deploy_interface": "fake",
                    "power_interface": "fake",
                    "management_interface": "fake",
                    "extra": extra,
                },
            )
        for target, want in (("manage", "manageable"), ("provide", "available")):
            for name in names:
                self.call("PUT", f"/v1/nodes/{name}/states/provision", {"target": target})
            self.wait(names, want, timeout)

    def wait(self, names: list[str], state: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        left = set(names)
        while left:
            nodes = self.call("GET", "/v1/nodes?fields=name,provision_state&limit=1000")["nodes"]
            left -= {n["name"] for n in nodes if n["provision_state"] == state}
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(left)} machines not {state} within {timeout:.0f} s: {sorted(left)[:5]}")
            time.sleep(0.2)
