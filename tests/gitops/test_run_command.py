"""`gpuaas run` and `gpuaas history` as processes: watch mode end to end, SIGTERM, racing reconcilers."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.store import connections
from tests.gitops.conftest import EXAMPLE, Repo, claims, history_rows


def _gpuaas(*args: str) -> list[str]:
    return [sys.executable, "-m", "reconciler.cli", *args]


def _wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            seen.append(line)
            if needle in line:
                return line
        if proc.poll() is not None:
            break
    raise AssertionError(f"{needle!r} not seen; output: {''.join(seen)}")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


@pytest.mark.slow
def test_watch_mode_places_a_commit_and_sigterm_exits_zero(
    fleet_repo: Repo, db_url: str, conn: connections.Connection
) -> None:
    proc = subprocess.Popen(
        _gpuaas("run", str(fleet_repo.root), "--db-url", db_url, "--interval", "60"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        _wait_for_line(proc, "applied")
        fleet_repo.request("req-watch", 1)
        deadline = time.monotonic() + 20
        while not claims(conn, "req-watch") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert claims(conn, "req-watch")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    assert "SIGTERM" in out and "stopped" in out and "Traceback" not in out


@pytest.mark.slow
def test_two_reconcilers_racing_apply_a_revision_once(
    fleet_repo: Repo, db_url: str, conn: connections.Connection
) -> None:
    sha = fleet_repo.request("req-race", 2)
    procs = [
        subprocess.Popen(
            _gpuaas("run", str(fleet_repo.root), "--db-url", db_url, "--once"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(),
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    applies = [r for r in history_rows(conn) if r[0] == sha and r[1].startswith("apply")]
    assert len(applies) == 1, outs
    assert len(claims(conn, "req-race")) == 2


def test_history_shows_each_reconciliation(fleet_repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", str(fleet_repo.root), "--db-url", db_url, "--once"]) == 0
    fleet_repo.write("allocations/bad.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: x\n")
    bad = fleet_repo.commit("broken")
    assert cli.main(["run", str(fleet_repo.root), "--db-url", db_url, "--once"]) == 1
    capsys.readouterr()
    assert cli.main(["history", "-n", "5", "--db-url", db_url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ID", "REVISION", "RESULT"]
    assert bad[:12] in out[1] and "error" in out[1] and "allocations/bad.yaml:" in out[1]
    assert out[2].split()[2] == "changed" and out[2].split()[6] == "apply"


def test_run_refuses_half_a_remote(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", str(fleet_repo.root), "--remote", "origin"]) == 1
    assert "cli.usage" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_gitops_measures_commit_to_claim(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert cli.main(["bench", "gitops", "--commits", "3", "--db-url", db_url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["commits"] == 3 and doc["reconciler_exit"] == 0
    assert 0 < doc["min_s"] <= doc["p50_s"] <= doc["p95_s"] <= doc["max_s"] < 30
    # plumbing commits: the latency starts when the commit lands, its writing is timed beside
    assert doc["git"] == "plumbing" and doc["commit_p50_s"] > 0 and doc["p50_s"] < doc["end_to_end_p50_s"]


def test_demo_step_shows_a_pr_plan_applies_it_and_prints_status(db_url: str, conn: connections.Connection) -> None:
    from gpuaas_tools.demo import gitops as gitops_demo

    lines: list[str] = []
    gitops_demo.run(EXAMPLE, db_url, out=lines.append)
    text = "\n".join(lines)
    assert "<!-- gpuaas-plan -->" in text and "| `alloc-0002` | globex | 2x h200-sxm-slice |" in text
    assert "applied " in text and "Status at revision" in text and "alloc-0003" in text
    assert [r[2] for r in history_rows(conn)] == ["changed"]
    again: list[str] = []
    gitops_demo.run(EXAMPLE, db_url, out=again.append)  # a second `make demo`: same fleet, nothing changes
    assert [r[2] for r in history_rows(conn)] == ["changed", "unchanged"]
