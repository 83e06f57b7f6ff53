"""`gpuaas host run --metrics-listen ... --log-format json` as a process on a lab host.

    lab node-a: 4 slots, alloc-2 on slots 2 and 3
    gen 1: provision alloc-2             -> converged, 2 slots active
    slot 3's disk mounted on the host, gen 2: release alloc-2
                                         -> wipe slot 2 ok, wipe slot 3 blocked (host.disk.mounted)

/metrics is scraped while the agent runs and parsed with prometheus_client.parser;
every line it logs must be a JSON object with time, level, event and node.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from host_reconciler import metrics
from schemas import hostplans
from schemas.errors import UsageError
from tests.host.conftest import Lab

ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:  # noqa: S310 - loopback
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_for(url: str, ok: Callable[[Samples], bool], timeout: float = 60.0) -> Samples:
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(url)
        if ok(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def test_host_agent_serves_metrics_and_health_and_logs_json(lab: Lab) -> None:
    plan_file = lab.root / "plan.json"
    vm = lab.vm("alloc-2", (2, 3), vcpus=4, memory_mib=2048)
    plan_file.write_text(json.dumps(hostplans.to_json(lab.plan(1, vms=(vm,)))))
    lines: list[str] = []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "host",
            "run",
            "--node",
            lab.node,
            "--config",
            str(lab.write_config()),
            "--plan-file",
            str(plan_file),
            "--interval",
            "0.2",
            "--metrics-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None and proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any('"host.metrics.serving"' in x for x in lines) and time.monotonic() < deadline:
            assert proc.poll() is None, lines
            time.sleep(0.05)
        url = json.loads(next(x for x in lines if '"host.metrics.serving"' in x))["url"]
        with urllib.request.urlopen(url + "/healthz", timeout=10) as resp:  # noqa: S310 - loopback
            assert resp.status == 200 and json.loads(resp.read())["node"] == lab.node
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/nope", timeout=10)  # noqa: S310 - loopback
        e.value.close()
        assert e.value.code == 404

        up = wait_for(url, lambda s: s.get(("gpuaas_host_converged", ())) == 1)
        assert up[("gpuaas_host_converged", ())] == 1
        assert up[("gpuaas_host_slots", (("state", "active"),))] == 2
        assert up[("gpuaas_host_actions_total", (("kind", "define_start"), ("result", "ok")))] == 1
        assert up[("gpuaas_host_info", (("node", lab.node),))] == 1
        assert up[("gpuaas_host_bootstrap_state", (("state", "never_run"),))] == 1  # the lab host never ran it
        assert up[("gpuaas_host_reboot_required", ())] == 0
        assert up[("gpuaas_host_converge_seconds_count", ())] >= 1
        assert up[("gpuaas_host_passes_total", (("result", "ok"),))] >= 1

        lab.loops.mount(lab.slot_disks[3])  # someone mounted slot 3's disk: its wipe must refuse
        plan_file.write_text(json.dumps(hostplans.to_json(lab.plan(2, releases=(vm,)))))
        blocked = (("result", "blocked"),)
        after = wait_for(url, lambda s: s.get(("gpuaas_host_wipes_total", blocked), 0) >= 1)
        assert after[("gpuaas_host_wipes_total", blocked)] == 1
        assert after[("gpuaas_host_wipes_total", (("result", "ok"),))] == 1
        assert after[("gpuaas_host_wipe_seconds_count", ())] == 1 and after[("gpuaas_host_wipe_seconds_sum", ())] > 0
        assert after[("gpuaas_host_actions_total", (("kind", "wipe"), ("result", "failed")))] == 1
        assert after[("gpuaas_host_slots", (("state", "cleanup_blocked"),))] == 1
        assert after[("gpuaas_host_passes_total", (("result", "step_errors"),))] >= 1
        drift = {dict(labels)["code"]: v for (name, labels), v in after.items() if name == "gpuaas_host_drift_findings"}
        assert drift == {"drift.disk.mounted": 1}  # slot 3 only
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    docs = [json.loads(x) for x in lines if x.strip()]  # every line: one JSON object
    for doc in docs:
        assert {"time", "level", "event", "message"} <= doc.keys() and doc["node"] == lab.node, doc
    failed = next(d for d in docs if d["event"] == "host.step.failed")
    assert failed["allocation"] == "alloc-2" and failed["step"] == "wipe" and failed["level"] == "error"
    assert any(d["event"] == "host.pass" and d["converged"] is True for d in docs)
    assert docs[-1]["event"] == "host.stopped"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:9101", ("127.0.0.1", 9101)),
        ("[::1]:0", ("::1", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),  # noqa: S104 - parsed, not bound
    ],
)
def test_metrics_listen_parses(value: str, expected: tuple[str, int]) -> None:
    assert metrics.parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9101", ":9101", "localhost:", "host:port", "127.0.0.1:70000"])
def test_a_bad_metrics_listen_is_a_usage_error(value: str) -> None:
    with pytest.raises(UsageError) as e:
        metrics.parse_listen(value)
    assert e.value.code == "host.metrics.listen_invalid"


def test_a_taken_port_is_a_usage_error() -> None:
    first = metrics.Server(metrics.AgentMetrics("n"), "127.0.0.1:0")
    try:
        port = first.url.rsplit(":", 1)[1]
        with pytest.raises(UsageError) as e:
            metrics.Server(metrics.AgentMetrics("n"), f"127.0.0.1:{port}")
        assert e.value.code == "host.metrics.bind_failed"
    finally:
        first.close()
