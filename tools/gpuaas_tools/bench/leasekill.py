"""`gpuaas bench leasekill`: kill -9 the reconcile loop mid-deploy and mid-erase, many times (issue 30).

A MAAS simulator in this process (it survives the kills and counts every
deploy and release it served) and a scratch database; the loop runs in a
subprocess (`python -m gpuaas_tools.bench.leasekill DB MAAS SSH LEASES MODE SEED`)
that is SIGKILLed after a random delay, or kills itself right after a
provider call and before the database records it. Afterwards: exactly one
deploy and one erase per lease, every allocation released, `db check` ok.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

from reconciler.commands import db
from schemas.errors import UsageError

KEY_ENV = "GPUAAS_LEASEKILL_MAAS_KEY"
KILL_P_ENV = "GPUAAS_LEASEKILL_P"


def register(sub: Any) -> None:
    p = sub.add_parser("leasekill", help="kill -9 the lease loop mid-deploy and mid-erase; count provider calls")
    p.add_argument("--kills", type=int, default=50, help="kills in all, half while deploying, half while erasing")
    p.add_argument("--leases", type=int, default=4)
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def fleet(maas_url: str, ssh: str, leases: int, mode: str) -> Any:
    from gpuaas_tools.bench import leases as fleets

    provider = {"name": "maas-kill", "kind": "maas", "url": maas_url, "credentials": {"env": KEY_ENV}}
    state = fleets.fleet(provider=provider, baremetal_nodes=leases, leases=leases, ssh_address=ssh)
    return fleets.released(state) if mode == "release" else state


def victim(url: str, maas_url: str, ssh: str, leases: int, mode: str, seed: int) -> int:  # noqa: PLR0917 - argv
    """The loop that gets killed: reconcile until every allocation is active (deploy) or released."""
    from reconciler.reconcile import reconciling
    from reconciler.store import connections

    rng = random.Random(seed)  # noqa: S311 - kill points, not security
    p = float(os.environ.get(KILL_P_ENV, "0"))

    def fault(_point: str) -> None:
        if rng.random() < p:
            os.kill(os.getpid(), signal.SIGKILL)

    state = fleet(maas_url, ssh, leases, mode)
    want = "active" if mode == "deploy" else "released"
    with connections.connect(url, autocommit=True) as conn:
        for _ in range(3000):
            reconciling.reconcile(conn, state, lease_fault=fault)
            row = conn.execute("SELECT count(*) FROM allocations WHERE status <> %s", (want,)).fetchone()
            if row == (0,):
                return 0
            time.sleep(0.02)
    return 3


def round_(  # noqa: PLR0917
    url: str,
    maas_url: str,
    ssh: str,
    leases: int,
    mode: str,
    seed: int,
    *,
    kill_after: float | None,
    kill_p: float,
    key: str,
) -> int | None:
    """One run of the victim; SIGKILLed after `kill_after` seconds when given. Returns its exit status."""
    env = {**os.environ, KILL_P_ENV: str(kill_p), KEY_ENV: key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuaas_tools.bench.leasekill", "--", url, maas_url, ssh, str(leases), mode, str(seed)],
        env=env,
    )
    try:
        if kill_after is not None:
            try:
                return proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        return proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def campaign(url: str, leases: int, kills: int, seed: int = 30) -> dict[str, Any]:
    """Kill the loop `kills` times (half deploying, half erasing), then let it finish; the provider's counts."""
    from gpuaas_tools.lab.maas_sim import API_KEY, MaasSimulator
    from reconciler.store import checks, connections, migrations

    rng = random.Random(seed)  # noqa: S311 - kill timing, not security
    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    threading.Thread(target=_accept, args=(listener,), daemon=True).start()
    ssh = f"127.0.0.1:{listener.getsockname()[1]}"
    machines = {f"bm-{i:05d}": "127.0.0.1" for i in range(leases)}
    killed = 0
    with MaasSimulator(machines, deploy_s=0.3, erase_s=0.3) as sim:
        for mode in ("deploy", "release"):
            for k in range(kills // 2 + (kills % 2 if mode == "release" else 0)):
                rc = round_(
                    url, sim.url, ssh, leases, mode, k, kill_after=rng.uniform(0.8, 3.0), kill_p=0.3, key=API_KEY
                )
                killed += rc != 0
            for _ in range(20):
                if round_(url, sim.url, ssh, leases, mode, 999, kill_after=None, kill_p=0.0, key=API_KEY) == 0:
                    break
        deploys, releases = dict(sim.deploys), dict(sim.releases)
    listener.close()
    with connections.connect(url, autocommit=True) as conn:
        violations = checks.run(conn)
        statuses = {
            str(k): int(v)
            for k, v in conn.execute("SELECT status, count(*) FROM allocations GROUP BY status").fetchall()
        }
        adopted = conn.execute("SELECT coalesce(sum(adopted), 0) FROM baremetal_leases").fetchone()
    return {
        "leases": leases,
        "kill_rounds": kills,
        "rounds_killed": killed,
        "adopted_after_kill": int(adopted[0]) if adopted else 0,
        "deploys_per_machine": deploys,
        "erases_per_machine": releases,
        "allocations": statuses,
        "db_check": [v.render() for v in violations],
        "ok": (
            sorted(deploys.values()) == [1] * leases
            and sorted(releases.values()) == [1] * leases
            and statuses == {"released": leases}
            and not violations
        ),
    }


def _accept(sock: socket.socket) -> None:
    while True:
        try:
            c, _ = sock.accept()
        except OSError:
            return
        c.close()


def run(args: argparse.Namespace) -> int:
    from gpuaas_tools.bench import claims as claims_bench

    if args.kills < 0 or args.leases < 1:
        raise UsageError("--kills must be at least 0 and --leases positive")
    base = db.database_url(args)
    name = f"gpuaas_bench_leasekill_{os.getpid()}"
    claims_bench._create_db(base, name)
    try:
        doc = campaign(claims_bench._scratch_url(base, name), args.leases, args.kills)
    finally:
        claims_bench._drop_db(base, name)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(
            f"{doc['kill_rounds']} kill rounds ({doc['rounds_killed']} ended by SIGKILL), {doc['leases']} leases, "
            f"{doc['adopted_after_kill']} provider requests adopted after a kill"
        )
        print(f"deploys per machine: {doc['deploys_per_machine']}")
        print(f"erases per machine:  {doc['erases_per_machine']}")
        print(f"allocations: {doc['allocations']}; db check {'ok' if not doc['db_check'] else doc['db_check']}")
        print("ok: exactly one deploy and one erase per lease" if doc["ok"] else "FAILED")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    a = sys.argv[2:8] if sys.argv[1:2] == ["--"] else sys.argv[1:7]
    sys.exit(victim(a[0], a[1], a[2], int(a[3]), a[4], int(a[5])))
