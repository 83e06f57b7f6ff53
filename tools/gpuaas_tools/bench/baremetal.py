"""`gpuaas bench baremetal`: baremetal leases against a real local Ironic (fake-hardware), in a scratch database.

Two figures (issue 30):

- sequential: `--leases` leases one after another on one machine: from the
  reconciliation that first sees the request (its commit) to `active`, and
  from the release to the node `available` (claim released); p50/p90 with
  the phase timings the lease records (deploy, SSH, erase), as `history`
  shows them;
- concurrent: `--concurrent` leases at once on as many machines: all active,
  all released, double deploys (a lease with more than one provider deploy,
  or a deploy adopted besides one sent), `db check`.

The reconcile loop ticks every `--tick` seconds, as `gpuaas run` would
between revisions; a TCP listener on 127.0.0.1 stands in for each machine's
SSH port (fake hardware boots nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from reconciler.commands import db
from schemas.errors import PermanentError, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("baremetal", help="baremetal lease latency and concurrency against a local Ironic")
    p.add_argument("--leases", type=int, default=20, help="sequential leases for the p50 (default 20)")
    p.add_argument("--concurrent", type=int, default=100, help="leases at once on as many machines (0: skip)")
    p.add_argument("--tick", type=float, default=0.2, help="seconds between reconciliations (default 0.2)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up after this many seconds per phase")
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpuaas_tools.bench import claims as claims_bench
    from gpuaas_tools.lab import ironic_service, sshstandin

    if args.leases < 1 or args.concurrent < 0 or args.tick <= 0:
        raise UsageError("--leases must be positive, --concurrent at least 0, --tick positive")
    venv = ironic_service.venv()
    if venv is None:
        raise PermanentError(
            "Ironic is not installed: `make deps` puts it in .venv/ironic", code="bench.ironic_missing"
        )
    base = db.database_url(args)
    doc: dict[str, Any] = {}
    listener = sshstandin.SshStandIn()
    machines = max(1, args.concurrent)
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-ironic-") as tmp:
        svc = ironic_service.IronicService(Path(tmp), venv_dir=venv)
        svc.start()
        try:
            t0 = time.perf_counter()
            svc.enroll([f"bm-{i:05d}" for i in range(machines)], timeout=args.timeout)
            doc["ironic"] = {"machines": machines, "enroll_s": round(time.perf_counter() - t0, 1)}
            provider = {"name": "ironic-bench", "kind": "ironic", "url": svc.url, "timeout_s": 60}
            for part, fn in (("sequential", _sequential), ("concurrent", _concurrent)):
                if part == "concurrent" and args.concurrent == 0:
                    continue
                name = f"gpuaas_bench_bm_{part}_{os.getpid()}"
                claims_bench._create_db(base, name)
                try:
                    doc[part] = fn(claims_bench._scratch_url(base, name), provider, listener.address, args)
                finally:
                    claims_bench._drop_db(base, name)
        finally:
            svc.stop()
            listener.close()
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        _print(doc)
    ok = doc["sequential"]["ok"] and doc.get("concurrent", {"ok": True})["ok"]
    return 0 if ok else 1


def _loop(conn: Any, state: Any, done: Any, tick: float, timeout: float) -> float:
    from reconciler.reconcile import reconciling

    t0 = time.perf_counter()
    while True:
        reconciling.reconcile(conn, state)
        if done():
            return time.perf_counter() - t0
        if time.perf_counter() - t0 > timeout:
            raise PermanentError(f"leases did not settle within {timeout:.0f} s", code="bench.timeout")
        time.sleep(tick)


def _count(conn: Any, sql: str, *params: Any) -> int:
    row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def _sequential(url: str, provider: dict[str, Any], ssh: str, args: argparse.Namespace) -> dict[str, Any]:
    from gpuaas_tools.bench import leases as fleets
    from reconciler.store import checks, connections, leases, migrations

    full = fleets.fleet(provider=provider, baremetal_nodes=1, leases=args.leases, ssh_address=ssh)
    ids = sorted(a for a in full.allocations)
    to_active, to_available, phases = [], [], []
    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        for i, aid in enumerate(ids):
            # Allocation i requested (earlier ones released, later ones not yet in git).
            state = fleets.released(full, ids[:i])
            state.allocations = {k: v for k, v in state.allocations.items() if k in ids[: i + 1]}
            to_active.append(
                _loop(
                    conn,
                    state,
                    lambda a=aid: (
                        _count(conn, "SELECT count(*) FROM allocations WHERE id = %s AND status = 'active'", a) == 1
                    ),
                    args.tick,
                    args.timeout,
                )
            )
            gone = fleets.released(full, ids[: i + 1])
            gone.allocations = {k: v for k, v in gone.allocations.items() if k in ids[: i + 1]}
            to_available.append(
                _loop(
                    conn,
                    gone,
                    lambda a=aid: (
                        _count(
                            conn,
                            "SELECT count(*) FROM allocation_resource_claims WHERE allocation_id = %s"
                            " AND status = 'released'",
                            a,
                        )
                        == 1
                    ),
                    args.tick,
                    args.timeout,
                )
            )
            phases.append(leases.details(conn, [aid])[aid]["timings_s"])
        violations = checks.run(conn)
        doubles = _count(
            conn, "SELECT count(*) FROM baremetal_leases WHERE deploy_requests + adopted > 1 OR erase_requests > 1"
        )
    return {
        "leases": len(ids),
        "tick_s": args.tick,
        "to_active_s": _stats(to_active),
        "to_available_s": _stats(to_available),
        "phases_s": {k: _stats([p[k] for p in phases if p[k] is not None]) for k in ("deploy", "ssh", "erase")},
        "double_deploys_or_erases": doubles,
        "db_check": [v.render() for v in violations],
        "ok": not violations and doubles == 0,
    }


def _concurrent(url: str, provider: dict[str, Any], ssh: str, args: argparse.Namespace) -> dict[str, Any]:
    from gpuaas_tools.bench import leases as fleets
    from reconciler.store import checks, connections, migrations

    n = args.concurrent
    state = fleets.fleet(provider=provider, baremetal_nodes=n, leases=n, ssh_address=ssh)
    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        active_s = _loop(
            conn,
            state,
            lambda: _count(conn, "SELECT count(*) FROM allocations WHERE status = 'active'") == n,
            args.tick,
            args.timeout,
        )
        released_s = _loop(
            conn,
            fleets.released(state),
            lambda: _count(conn, "SELECT count(*) FROM allocations WHERE status = 'released'") == n,
            args.tick,
            args.timeout,
        )
        violations = checks.run(conn)
        doubles = _count(conn, "SELECT count(*) FROM baremetal_leases WHERE deploy_requests + adopted > 1")
        erases = _count(conn, "SELECT count(*) FROM baremetal_leases WHERE erase_requests > 1")
        deployed = _count(conn, "SELECT count(DISTINCT machine_id) FROM baremetal_leases WHERE deploy_requests = 1")
        erased = _count(conn, "SELECT count(*) FROM baremetal_leases WHERE phase = 'erased'")
    return {
        "leases": n,
        "all_active_s": round(active_s, 1),
        "all_released_s": round(released_s, 1),
        "machines_deployed_once": deployed,
        "leases_erased": erased,
        "double_deploys": doubles,
        "double_erases": erases,
        "db_check": [v.render() for v in violations],
        "ok": not violations and doubles == 0 and erases == 0 and erased == n,
    }


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "max": None}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p90": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "max": round(ordered[-1], 3),
    }


def _print(doc: dict[str, Any]) -> None:
    print(f"ironic: {doc['ironic']['machines']} fake-hardware machines enrolled in {doc['ironic']['enroll_s']} s")
    s = doc["sequential"]
    print(f"sequential: {s['leases']} leases, reconcile tick {s['tick_s']} s")
    print(f"  request -> active      p50 {s['to_active_s']['p50']} s  p90 {s['to_active_s']['p90']} s")
    print(f"  release -> available   p50 {s['to_available_s']['p50']} s  p90 {s['to_available_s']['p90']} s")
    for k, v in s["phases_s"].items():
        print(f"  phase {k:<7} p50 {v['p50']} s  p90 {v['p90']} s")
    print(
        f"  double deploys/erases {s['double_deploys_or_erases']}, db check "
        f"{'ok' if not s['db_check'] else s['db_check']}"
    )
    c = doc.get("concurrent")
    if c:
        print(
            f"concurrent: {c['leases']} leases: all active in {c['all_active_s']} s, all released in "
            f"{c['all_released_s']} s; erased {c['leases_erased']}, double deploys {c['double_deploys']}, "
            f"double erases {c['double_erases']}, db check {'ok' if not c['db_check'] else c['db_check']}"
        )
