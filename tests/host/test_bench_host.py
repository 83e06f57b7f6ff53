"""`gpuaas bench host` end to end on a lab host: it converges, scans and wipes, or says nothing.

The bench builds its own plans; when the host's rules tighten (an approval must
record the disk's identity), a bench left behind fails here, not in an
operator's hands.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_host_converges_scans_and_wipes_a_lab_host() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "bench", "host", "--runs", "1", "--json"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verified"] is True
    assert doc["converge_1gpu_ms"] > 0 and doc["drift_scan_8slot_ms"] > 0 and doc["wipe_verify_1gib_ms"] > 0
    assert set(doc["converge_1gpu_phase_ms"]) >= {"lease", "host_checks", "disk_write", "define_start"}
