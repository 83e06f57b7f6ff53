"""SIGKILL a reconciler at random points while it places, releases and frees: the store stays sound."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from desired.state import DesiredState
from gpuaas_tools.bench import synthetic
from reconciler.store import checks, inventory
from reconciler.store.connections import Connection
from tests.claims import util

ROOT = Path(__file__).resolve().parents[2]
KILLS = 12


def kill_fleet() -> DesiredState:
    return synthetic.fleet(
        nodes=6, baremetal_nodes=2, allocations=1200, baremetal_allocations=150, gpus=(1, 2, 4), seed=3
    )


def _victim(db_url: str, seed: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.claims.racers", db_url, str(seed)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", (line, proc.stderr.read() if proc.stderr else "")
    return proc


def test_sigkill_at_random_points_leaves_db_check_clean(db_url: str, conn: Connection) -> None:
    inventory.sync(conn, kill_fleet())
    rng = random.Random(os.getpid())  # noqa: S311 - test randomness
    for k in range(KILLS):
        proc = _victim(db_url, k)
        time.sleep(rng.uniform(0.05, 0.6))
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()
        violations = checks.run(conn)
        assert violations == [], f"after kill {k}: {[v.render() for v in violations]}"
    # One victim left alone for a while: ONE session (one process, one connection) places
    # baremetal claims, then slice claims, then baremetal again. Restarting victims often would
    # hide a session that wedged on a mix of kinds; a wedged one would stop switching.
    proc = _victim(db_url, KILLS)
    time.sleep(2.5)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=30)
    assert alive, err
    switches = [line.split()[1:] for line in out.splitlines() if line.startswith("placed ")]
    order = [kind for kind, _, _ in switches]
    assert len({session for _, _, session in switches}) == 1, (out, err)  # the same backend throughout
    assert {("node_exclusive", "slot"), ("slot", "node_exclusive")} <= set(itertools.pairwise(order)), order
    for kind, allocation, _ in switches:  # what the victim says it placed is in the store, of that kind
        assert (
            util.count(
                conn,
                "SELECT count(*) FROM allocation_resource_claims WHERE allocation_id = %s AND claim_kind::text = %s",
                allocation,
                kind,
            )
            > 0
        ), (kind, allocation)
    assert checks.run(conn) == []
    # No ghosts: every round a kill interrupted reads as abandoned, none as running.
    assert util.count(conn, "SELECT count(*) FROM reconciliation_history WHERE result = 'running'") == 0
    assert util.count(conn, "SELECT count(*) FROM reconciliation_history WHERE result = 'abandoned'") > 0
    placed = util.count(conn, "SELECT count(*) FROM allocation_resource_claims")
    freed = util.count(conn, "SELECT count(*) FROM allocation_resource_claims WHERE status = 'released'")
    assert placed > 0 and freed > 0  # the victims got real work done between kills
    # ... including reschedules after (played) host failures, with quarantined or cleared slots
    assert util.count(conn, "SELECT count(*) FROM allocation_attempts WHERE outcome = 'rescheduled'") > 0
    assert util.count(conn, "SELECT count(*) FROM retired_claims") > 0
    # The command operators run after an incident agrees.
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "db", "check", "--db-url", db_url],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "invariants hold" in done.stdout
