"""`gpuaas bench telemetry` end to end on two VMs: every posted guest sample reaches the API, figures printed.

No time bound is asserted (figures come from the bench, not from tests):
only that each sample arrived through listener, agent report, store and API,
and that the scratch database is gone afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def test_bench_telemetry_times_every_sample_to_the_api(db_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "bench",
            "telemetry",
            "--db-url",
            db_url,
            "--samples",
            "3",
            "--vms",
            "2",
            "--report-interval",
            "0.2",
            "--json",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["samples"] == 3 and doc["vms"] == 2 and doc["agent_reports"] >= 1
    assert 0 < doc["p50_ms"] <= doc["p95_ms"] <= doc["max_ms"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'gpuaas_bench_telemetry_%'").fetchone()
    assert left is not None and left[0] == 0


def test_bench_telemetry_refuses_bad_arguments(db_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "bench", "telemetry", "--db-url", db_url, "--vms", "9"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "bench.telemetry.usage" in done.stderr and "Traceback" not in done.stderr
