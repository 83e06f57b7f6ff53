"""/metrics of `serve` and of the host agent: names and units pass a real `promtool check metrics`, and the
labelled gauges alerts need are there (issue 34)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.service.conftest import Served
from tests.service.test_metrics_usage import _samples

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: prometheus)")


def promtool_check(text: str) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    return (done.stdout + done.stderr).strip() if done.returncode != 0 or done.stdout.strip() else ""


@needs_promtool
def test_serve_metrics_pass_promtool(served: Served) -> None:
    served.json("/api/v1/capacity")  # computed now: the scrape holds every family
    _, _, body = served.get("/metrics")
    assert promtool_check(body.decode()) == ""


def test_serve_metrics_carry_node_sku_and_region_labels(served: Served) -> None:
    served.json("/api/v1/capacity")
    _, _, body = served.get("/metrics")
    text = body.decode()
    m = _samples(text)
    assert "_created" not in text
    live = {dict(k)["node"]: v for k, v in m["gpuaas_node_live"].items()}
    assert live["h200-use1-s01"] == 1  # it reported just now (tests/service/conftest.py)
    assert all(dict(k)["region"] for k in m["gpuaas_node_last_report_timestamp_seconds"])
    states = {
        (dict(k)["sku"], dict(k)["state"]): v
        for k, v in m["gpuaas_sku_gpus"].items()
        if dict(k)["region"] == "us-east-1"
    }
    assert (
        states[("h200-sxm-slice", "total")] == states[("h200-sxm-slice", "used")] + states[("h200-sxm-slice", "free")]
    )
    assert states[("h200-sxm-baremetal-8g", "total")] % 8 == 0  # whole nodes of 8 GPUs
    assert sum(m["gpuaas_sku_allocations"].values()) >= 1
    info = list(m["gpuaas_build_info"])
    assert len(info) == 1 and dict(info[0])["version"]
    assert "process_resident_memory_bytes" in m and "process_cpu_seconds_total" in m


def test_host_agent_metrics_pass_promtool_without_created_series() -> None:
    from prometheus_client import generate_latest

    from host_reconciler import metrics

    agent = metrics.AgentMetrics("node-a")
    agent.failed()
    agent.actions.labels("wipe", "ok").inc()
    agent.converge.observe(1.5)
    text = generate_latest(agent.registry).decode()
    assert "_created" not in text  # counters and histograms alike
    m = _samples(text)
    assert m["gpuaas_host_passes_total"][(("result", "failed"),)] == 1
    assert dict(next(iter(m["gpuaas_build_info"])))["version"] and "process_resident_memory_bytes" in m
    if PROMTOOL is not None:
        assert promtool_check(text) == ""
