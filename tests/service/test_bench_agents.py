"""`gpuaas bench agents` runs end to end (a few agents, a few seconds): its figures come from real HTTP."""

from __future__ import annotations

import json

import pytest

from reconciler import cli

KEYS = {
    "agents",
    "errors",
    "plan_latency_p50_s",
    "plan_latency_p99_s",
    "db_connections_max",
    "serve_rss_mib",
    "serve_cpu_s_per_1000_requests",
}


def test_bench_agents_prints_the_figures(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(
            ["bench", "agents", "--agents", "20", "--duration", "4", "--ramp", "0.5", "--json", "--db-url", db_url]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc.keys() >= KEYS
    assert doc["agents"] == 20 and doc["errors"] == 0
    assert doc["placements_received"] >= 1 and doc["plan_latency_p50_s"] is not None
    assert 0 < doc["db_connections_max"] <= 25 and doc["serve_rss_mib"] > 0
