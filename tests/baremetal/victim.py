"""The reconcile loop the kill tests SIGKILL: reconciles a baremetal fleet until every lease settles.

    python -m tests.baremetal.victim DB_URL MAAS_URL SSH_ADDRESS LEASES {deploy|release} SEED

With GPUAAS_TEST_KILL_P set, it also kills itself with that probability right
after a provider call and before the database records it (the worst moment).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

from reconciler import reconciling
from reconciler.bench import leases as fleets
from reconciler.store import connections


def main() -> None:
    url, maas_url, ssh, count, mode, seed = sys.argv[1:7]
    rng = random.Random(int(seed))  # noqa: S311 - test randomness
    p = float(os.environ.get("GPUAAS_TEST_KILL_P", "0"))

    def fault(point: str) -> None:
        if rng.random() < p:
            os.kill(os.getpid(), signal.SIGKILL)

    provider = {"name": "maas-test", "kind": "maas", "url": maas_url, "credentials": {"env": "GPUAAS_TEST_MAAS_KEY"}}
    state = fleets.fleet(provider=provider, baremetal_nodes=int(count), leases=int(count), ssh_address=ssh)
    if mode == "release":
        state = fleets.released(state)
    want = "active" if mode == "deploy" else "released"
    with connections.connect(url, autocommit=True) as conn:
        for _ in range(2000):
            reconciling.reconcile(conn, state, lease_fault=fault)
            row = conn.execute("SELECT count(*) FROM allocations WHERE status <> %s", (want,)).fetchone()
            if row == (0,):
                return
            time.sleep(0.02)
    sys.exit(3)


if __name__ == "__main__":
    main()
