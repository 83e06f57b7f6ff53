"""`gpuaas bench apply`: validate and a cold apply of the same committed tree, each run in a scratch database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
from psycopg import conninfo

CLI = [sys.executable, "-m", "reconciler.cli", "bench", "apply"]


def _scratch_databases(url: str) -> list[str]:
    with psycopg.connect(conninfo.make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'gpuaas_bench_apply_%'").fetchall()
    return [r[0] for r in rows]


def test_each_run_times_validate_then_apply_into_an_empty_store(db_url: str, tmp_path: Path) -> None:
    repo = tmp_path / "fleet"
    argv = [*CLI, "--nodes", "3", "--runs", "2", "--dir", str(repo), "--db-url", db_url, "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    doc = json.loads(done.stdout)
    assert done.returncode == (0 if doc["goal_met"] else 1), done.stderr
    assert len(doc["runs"]) == 2 and doc["nodes"] == 3 and doc["goal_ratio"] == 1.5
    for r in doc["runs"]:
        assert r["validate_s"] > 0 and r["apply_s"] > 0
        assert abs(r["ratio"] - r["apply_s"] / r["validate_s"]) < 0.02
    assert doc["goal_met"] is (doc["median_ratio"] <= 1.5)
    # the fleet is committed (apply refuses a dirty tree) and kept for the next run; no scratch database is left
    assert len(list((repo / "nodes").glob("*.yaml"))) == 3
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == ""
    assert _scratch_databases(db_url) == []
    again = subprocess.run(
        [*CLI, "--nodes", "4", "--runs", "1", "--dir", str(repo), "--db-url", db_url],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert again.returncode == 1 and "holds a fleet of 3 nodes, not 4" in again.stderr
    assert "Traceback" not in again.stderr


def test_a_directory_it_did_not_write_is_refused(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    done = subprocess.run(
        [*CLI, "--nodes", "3", "--dir", str(tmp_path), "--db-url", db_url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and "is not empty" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and not (tmp_path / ".git").exists()
