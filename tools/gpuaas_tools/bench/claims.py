"""`gpuaas bench claims`: K reconciler processes racing to place M allocations on N nodes.

Each worker is a separate process with its own connection. It plans its
share of the allocations first-fit over its own view of the free slots (nodes
visited in a per-worker shuffled order, so workers mostly pick different
nodes and sometimes collide), then places them one transaction each through
`claims.place_many` (as `gpuaas apply` does: up to 100 placements per
round trip, each committed on its own), taking the next candidate after a
lost race and re-reading the free slots for a second round when all
candidates were lost. The timed part is only the placing. Afterwards the
invariant checks run. pgbench measures single-row-insert TPS with the same
client count on the same server (same fsync/synchronous_commit settings):
with the simple query protocol (pgbench's default) right before and right
after the placing, the headline ratio being to the mean of the two (the WAL
flush time of a shared disk drifts), and with prepared statements after.

A CHECKPOINT (best effort: it needs a superuser or pg_checkpoint) runs before
the placing and before pgbench, so neither is timed while the server writes
back what the setup before it dirtied (creating the database and syncing the
fleet write ~40 MB; WAL flushes queued behind that write-back took twice as
long).

Everything happens in a scratch database on the chosen server (the embedded
one unless --db-url / GPUAAS_DATABASE_URL), dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.commands import db
from schemas.errors import PermanentError, UsageError

ROUNDS = 3  # re-plan rounds per worker after every candidate of an allocation was lost


def register(sub: Any) -> None:
    p = sub.add_parser("claims", help="claims/s of K racing reconciler processes vs pgbench inserts")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--gpus", default="1", help="comma-separated GPU counts drawn per request (default 1)")
    p.add_argument("--alternatives", type=int, default=4, help="next candidates per placement")
    p.add_argument("--pgbench-seconds", type=float, default=10.0)
    p.add_argument("--no-pgbench", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep the scratch database")
    p.add_argument("--json", action="store_true")
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def _scratch_url(base: str, name: str) -> str:
    from psycopg import conninfo

    return conninfo.make_conninfo(base, dbname=name)


def _create_db(base: str, name: str) -> None:
    from psycopg import sql

    from reconciler.store import connections
    from schemas import dberrors

    with connections.connect(base, autocommit=True) as conn, dberrors.wrapped("create scratch database"):
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def _drop_db(base: str, name: str) -> None:
    from psycopg import sql

    from reconciler.store import connections
    from schemas import dberrors

    with connections.connect(base, autocommit=True) as conn, dberrors.wrapped("drop scratch database"):
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _settings(url: str) -> dict[str, str]:
    from reconciler.store import connections

    with connections.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN"
            " ('fsync', 'synchronous_commit', 'server_version', 'max_connections')"
        ).fetchall()
    return {str(k): str(v) for k, v in rows}


def _fleet_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"nodes": args.nodes, "allocations": args.requests, "gpus": tuple(args.gpus_list), "seed": 7}


@dataclass(frozen=True, slots=True)
class Job:
    url: str
    index: int
    workers: int
    fleet_args: dict[str, Any]
    alternatives: int


def worker(job: Job, barrier: Any, results: Any) -> None:
    """One reconciler process: plan its share, wait for the others, place, report."""
    from gpuaas_tools.bench import synthetic
    from reconciler.store import claims, connections, live

    url, index, workers, alternatives = job.url, job.index, job.workers, job.alternatives
    state = synthetic.fleet(**job.fleet_args)
    mine = sorted(state.allocations)[index::workers]
    conn = connections.connect(url, autocommit=True)
    placements = synthetic.first_fit(state, live.free_slots(conn), mine, alternatives=alternatives, seed=index + 1)
    unplanned = len(mine) - len(placements)
    barrier.wait()
    started = time.time()
    placed = claimed = conflicts = 0
    for round_ in range(ROUNDS):
        lost: list[str] = []
        for r in claims.place_many(conn, placements, revision="bench", max_claim_attempts=alternatives + 1):
            conflicts += r.conflicts
            if r.placed:
                placed += 1
                claimed += len(r.claim_ids)
            elif r.pending_code == claims.CONFLICT_EXHAUSTED:
                lost.append(r.allocation_id)
        if not lost or round_ == ROUNDS - 1:
            unplanned += len(lost)
            break
        placements = synthetic.first_fit(
            state, live.free_slots(conn), lost, alternatives=alternatives, seed=index + 100 * (round_ + 1)
        )
        unplanned += len(lost) - len(placements)
    finished = time.time()
    conn.close()
    results.put(
        {
            "worker": index,
            "placed": placed,
            "claims": claimed,
            "conflicts": conflicts,
            "pending": unplanned,
            "started": started,
            "finished": finished,
        }
    )


def _checkpoint(url: str) -> bool:
    """CHECKPOINT if this role may (superuser or pg_checkpoint); False when it may not."""
    import psycopg

    from reconciler.store import connections

    with connections.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            return False
    return True


def _pgbench(url: str, clients: int, seconds: float, protocol: str = "simple") -> float | None:
    from reconciler.store import connections, embedded

    with connections.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_insert (id bigserial PRIMARY KEY, v integer NOT NULL,"
            " created_at timestamptz NOT NULL DEFAULT now())"
        )
    try:
        binary = str(embedded.bin_dir() / "pgbench")
    except PermanentError:
        binary = shutil.which("pgbench") or ""
    if not binary or not Path(binary).exists():
        return None
    with tempfile.TemporaryDirectory(prefix="gpuaas-pgbench-") as tmp:
        script = Path(tmp) / "insert.sql"
        script.write_text("INSERT INTO bench_insert (v) VALUES (1);\n")
        done = subprocess.run(
            [
                binary,
                "-n",
                "-M",
                protocol,
                "-f",
                str(script),
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-T",
                str(max(1, round(seconds))),
                url,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=seconds + 120,
        )
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", done.stdout)
    if done.returncode != 0 or not match:
        raise PermanentError(f"pgbench failed: {done.stderr.strip()[-400:]}", code="bench.pgbench")
    return float(match.group(1))


def run(args: argparse.Namespace) -> int:
    from gpuaas_tools.bench import synthetic
    from reconciler.store import checks, connections, inventory, migrations

    try:
        args.gpus_list = sorted({int(g) for g in str(args.gpus).split(",") if g.strip()})
    except ValueError as e:
        raise UsageError(f"--gpus takes comma-separated integers, not {args.gpus!r}") from e
    if args.workers < 1 or args.nodes < 1 or args.requests < 1 or not set(args.gpus_list) <= {1, 2, 4, 8}:
        raise UsageError("--workers, --nodes and --requests must be positive; --gpus from 1,2,4,8")
    base = db.database_url(args)
    name = f"gpuaas_bench_{os.getpid()}"
    _create_db(base, name)
    url = _scratch_url(base, name)
    try:
        with connections.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
            t0 = time.perf_counter()
            inventory.sync(conn, synthetic.fleet(**_fleet_args(args)))
            sync_s = time.perf_counter() - t0
        checkpointed = _checkpoint(url)
        before = None if args.no_pgbench else _pgbench(url, args.workers, args.pgbench_seconds)
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(args.workers)
        results = ctx.Queue()
        procs = [
            ctx.Process(
                target=worker, args=(Job(url, i, args.workers, _fleet_args(args), args.alternatives), barrier, results)
            )
            for i in range(args.workers)
        ]
        for proc in procs:
            proc.start()
        reports = [results.get(timeout=3600) for _ in procs]
        for proc in procs:
            proc.join()
        with connections.connect(url, autocommit=True) as conn:
            violations = checks.run(conn)
        after = prepared = None
        if not args.no_pgbench:
            _checkpoint(url)
            after = _pgbench(url, args.workers, args.pgbench_seconds)
            prepared = _pgbench(url, args.workers, args.pgbench_seconds, "prepared")
        pgbench = (before + after) / 2 if before and after else None
        settings = _settings(url)
    finally:
        if not args.keep:
            _drop_db(base, name)
    wall = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
    claims = sum(r["claims"] for r in reports)
    placed = sum(r["placed"] for r in reports)
    doc = {
        "nodes": args.nodes,
        "slots": args.nodes * 8,
        "requests": args.requests,
        "workers": args.workers,
        "gpus": args.gpus_list,
        "placed": placed,
        "claims": claims,
        "seconds": round(wall, 3),
        "claims_per_second": round(claims / wall, 1) if wall > 0 else None,
        "placements_per_second": round(placed / wall, 1) if wall > 0 else None,
        "double_claims": checks.double_claims(violations),
        "violations": [v.render() for v in violations],
        "conflicts_retried": sum(r["conflicts"] for r in reports),
        "pending": sum(r["pending"] for r in reports),
        "pgbench_insert_tps": round(pgbench, 1) if pgbench else None,
        "pgbench_insert_tps_before_after": [before, after] if pgbench else None,
        "claims_vs_pgbench": round(claims / wall / pgbench, 3) if pgbench and wall > 0 else None,
        "pgbench_insert_tps_prepared": prepared,
        "claims_vs_pgbench_prepared": round(claims / wall / prepared, 3) if prepared and wall > 0 else None,
        "checkpointed": checkpointed,
        "inventory_sync_seconds": round(sync_s, 3),
        "server": settings,
        "database": "scratch " + ("(kept) " + url if args.keep else "(dropped)"),
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render_text(doc))
    return 1 if violations else 0


def render_text(doc: dict[str, Any]) -> str:
    gpus = ",".join(str(g) for g in doc["gpus"])
    lines = [
        f"claims bench: {doc['workers']} worker process(es), {doc['nodes']} nodes ({doc['slots']} slots), "
        f"{doc['requests']} requests of {gpus} GPU(s)",
        f"  claims_per_second      {doc['claims_per_second']}",
        f"  placements_per_second  {doc['placements_per_second']}  ({doc['placed']} placed, {doc['claims']} claims "
        f"in {doc['seconds']}s)",
        f"  double_claims          {doc['double_claims']}",
        f"  conflicts_retried      {doc['conflicts_retried']}",
        f"  pending                {doc['pending']}",
    ]
    if doc["pgbench_insert_tps"] is not None:
        b, a = doc["pgbench_insert_tps_before_after"]
        lines.append(
            f"  pgbench insert TPS     {doc['pgbench_insert_tps']:.1f} ({doc['workers']} client(s), simple "
            f"protocol, mean of {b:.0f} before and {a:.0f} after); "
            f"claims/s = {100 * (doc['claims_vs_pgbench'] or 0):.0f}% of it"
        )
    if doc["pgbench_insert_tps_prepared"] is not None:
        lines.append(
            f"  pgbench insert TPS     {doc['pgbench_insert_tps_prepared']:.1f} (prepared); claims/s = "
            f"{100 * (doc['claims_vs_pgbench_prepared'] or 0):.0f}% of it"
        )
    s = doc["server"]
    lines.append(
        f"  server                 PostgreSQL {s.get('server_version')}, fsync={s.get('fsync')}, "
        f"synchronous_commit={s.get('synchronous_commit')}; inventory sync {doc['inventory_sync_seconds']}s"
        + ("" if doc["checkpointed"] else "; no CHECKPOINT before timing (not permitted)")
    )
    lines += [f"  VIOLATION {v}" for v in doc["violations"]]
    return "\n".join(lines)
