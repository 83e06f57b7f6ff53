"""`gpuaas bench claims` end to end on a tiny fleet: racing workers, checks, both pgbench figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_claims_reports_throughput_checks_and_pgbench(db_url: str) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "bench",
            "claims",
            "--db-url",
            db_url,
            "--nodes",
            "4",
            "--requests",
            "24",
            "--workers",
            "2",
            "--gpus",
            "1,2",
            "--pgbench-seconds",
            "1",
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
    assert doc["double_claims"] == 0 and doc["violations"] == []
    assert doc["placed"] + doc["pending"] == 24 and doc["placed"] > 0
    assert doc["claims_per_second"] > 0 and doc["checkpointed"] is True
    assert doc["pgbench_insert_tps"] > 0 and doc["pgbench_insert_tps_prepared"] > 0
    assert doc["database"] == "scratch (dropped)"
