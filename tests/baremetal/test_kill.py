"""kill -9 of the reconcile loop mid-deploy and mid-erase, at random points (issue 30).

Each round starts the loop in a subprocess and SIGKILLs it after a random
delay (or it kills itself right after a provider call, before the database
records it). Afterwards every lease is deployed exactly once and erased
exactly once (the simulator counts the calls it served), the allocations
end active then released, and `db check` finds nothing.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reconciler.providers.lab.maas_sim import MaasSimulator
from reconciler.store import checks
from reconciler.store.connections import Connection
from tests.baremetal.conftest import Listener

ROOT = Path(__file__).resolve().parents[2]
LEASES = 4
KILLS = 10


def _round(db_url: str, maas: MaasSimulator, ssh: Listener, mode: str, seed: int, *, kill_after: float | None,
           kill_p: float) -> int | None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUAAS_TEST_KILL_P": str(kill_p)}
    proc = subprocess.Popen([sys.executable, "-m", "tests.baremetal.victim", db_url, maas.url, ssh.address,
                             str(LEASES), mode, str(seed)], env=env, cwd=ROOT)
    try:
        if kill_after is not None:
            try:
                return proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_kill_nine_mid_deploy_and_mid_erase_deploys_and_erases_each_lease_once(
        db_url: str, conn: Connection, maas: MaasSimulator, ssh: Listener) -> None:
    rng = random.Random(30)  # noqa: S311 - test timing, not security
    maas.deploy_s = maas.erase_s = 0.3
    for mode in ("deploy", "release"):
        for k in range(KILLS // 2):
            _round(db_url, maas, ssh, mode, k, kill_after=rng.uniform(0.8, 3.0), kill_p=0.3)
        deadline = time.monotonic() + 300
        while _round(db_url, maas, ssh, mode, 99, kill_after=None, kill_p=0.0) != 0:
            assert time.monotonic() < deadline
    assert sorted(maas.deploys.values()) == [1] * LEASES, maas.deploys
    assert sorted(maas.releases.values()) == [1] * LEASES, maas.releases
    rows = conn.execute("SELECT status, count(*) FROM allocations GROUP BY status").fetchall()
    assert rows == [("released", LEASES)]
    phases = conn.execute("SELECT phase, count(*) FROM baremetal_leases GROUP BY phase").fetchall()
    assert phases == [("erased", LEASES)]
    assert checks.run(conn) == []
    adopted = conn.execute("SELECT sum(adopted) FROM baremetal_leases").fetchone()
    print(f"requests adopted after a kill: {adopted[0] if adopted else 0}")
