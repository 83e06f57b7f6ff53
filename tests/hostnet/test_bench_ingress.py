"""`gpuaas bench ingress` end to end on its namespace lab (small): it prints every figure, or fails here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.root


def test_bench_ingress_prints_its_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "bench", "ingress", "--runs", "2", "--allocations", "4", "--json"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["rules_per_node_4"] == 2 * 4 + 2
    assert doc["ingress_phase_ms"] > 0 and doc["ready_to_ssh_ms"] > 0 and doc["pass_4_ms"] > 0
