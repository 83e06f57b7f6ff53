"""`gpuaas bench prplan` on a small fleet: every case is a real plan process, and the kept base is used."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaas_tools.bench import prplan


def test_the_bench_times_every_case_and_checks_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # as on a development machine
    root = tmp_path / "repo"
    base = prplan._build(root, 12)
    said: list[str] = []
    out = prplan.measure(root, base, runs=2, work=tmp_path, say=said.append)
    for case, runs in (("no_cache", 2), ("fresh_dir", 2), ("second", 1), ("cached", 2)):
        assert len(out[case]["times_s"]) == runs and all(t > 0 for t in out[case]["times_s"]), case
        assert out[case]["peak_rss_mib"] > 10, case  # a Python process, measured on its own
    assert out["same_output"] is True
    assert len(list((tmp_path / "kept").glob("world-*"))) == 1  # the cached plans had a kept base to read
    assert len(said) == 7
    # every plan ran from bytecode compiled into the bench's own temp dir, as an installed package does
    assert list((tmp_path / "pycache").rglob("prplan.cpython-*.pyc"))
    assert list((tmp_path / "pycache").rglob("keptworlds.cpython-*.pyc"))
    # each head was new: the base stays where it was, and the repo holds one commit per head
    assert (
        subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        == base
    )


def test_the_command_prints_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "bench", "prplan", "--nodes", "8", "--runs", "1", "--json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    out = json.loads(done.stdout)
    assert out["nodes"] == 8 and out["files"] == 21 and out["same_output"] is True
    assert done.returncode == (0 if out["goal_met"] else 1)
