"""`gpuaas bench serve` runs end to end on a small fleet: real HTTP, and each restart a fresh `gpuaas serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_bench_serve_restarts_the_service_as_a_process_and_prints_the_figures(db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # the kept capacity document goes here
    argv = [sys.executable, "-m", "reconciler.cli", "bench", "serve", "--nodes", "20", "--requests", "10"]
    done = subprocess.run(
        [*argv, "--samples", "3", "--json", "--db-url", db_url],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["nodes"] == 20 and doc["allocations_placed"] == 10
    for key in ("capacity_restart", "capacity_restart_after_commit"):
        restart = doc[key]
        # the "serving on" line comes first, from a process that was started for this restart
        assert 0 < restart["ready_line_s"] <= restart["s"]
    # each restart's service kept what it computed: the store holds the document under the bench's cache dir
    assert any((tmp_path / "cache").rglob("*")), "no capacity document kept"
    assert doc["allocation"]["n"] == 3 and doc["capacity_warm"]["p50_ms"] > 0
