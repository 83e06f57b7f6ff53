"""`gpuaas serve` as a process (JSON logs, SIGTERM) and `gpuaas --version`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == f"gpuaas {metadata.version('gpuaas-reconciler')}"


def test_serve_process_logs_json_and_stops_on_sigterm(fleet_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUAAS_LOG_FORMAT"}
    with subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--db-url",
            fleet_url,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()
            m = re.match(r"serving on (http://127\.0\.0\.1:\d+) ", line)
            assert m, line
            url = m.group(1) + "/api/v1/allocations/alloc-0001"
            with urllib.request.urlopen(url, timeout=60) as resp:  # noqa: S310 - loopback
                assert json.loads(resp.read())["id"] == "alloc-0001"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
    logs = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    request = next(x for x in logs if x.get("event") == "request")
    assert request["path"] == "/api/v1/allocations/alloc-0001" and request["status"] == 200
    assert request["level"] == "info" and request["time"].endswith("+00:00") and request["ms"] >= 0
