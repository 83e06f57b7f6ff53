"""`node_image_cache` (migration 0052) in a real PostgreSQL: each host reports its own cache; the
planner's observed state reads every node's.

    node-a's role writes node-a's rows (a pass replaces them), never node-b's
    central (owner) observes: image_cache = {node-a: {...}, node-b: {...}}
"""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from host_reconciler import hostdb
from host_reconciler.imagecache import CacheEntry
from host_reconciler.statuses import ImageCacheReport
from reconciler.store import connections, live
from reconciler.store import hostplans as central_plans
from schemas.errors import GpuaasError
from tests.host.test_hostdb import add_node, plan, status

A, B, C = "a" * 64, "b" * 64, "c" * 64


def with_images(node: str, *digests: str) -> object:
    entries = tuple(
        CacheEntry(d, f"/var/lib/gpuaas/images/sha256/{d}", 1000 + i, 1_700_000_000.0 + i)
        for i, d in enumerate(digests)
    )
    return dataclasses.replace(status(node), images=ImageCacheReport(entries=entries, in_use=digests[:1]))


def test_each_pass_replaces_the_nodes_rows_and_the_planner_sees_them(db_url: str) -> None:
    with hostdb.connect(db_url) as conn:
        creds = {}
        for node in ("node-a", "node-b"):
            add_node(conn, node)
            central_plans.store(conn, [plan(node)])
            creds[node] = hostdb.create_node_role(conn, node, f"pw-{node}")
        hostdb.write_status(conn, with_images("node-b", C))  # type: ignore[arg-type]
    a = creds["node-a"]
    with hostdb.connect(db_url, role=a.role, password=a.password) as conn:
        hostdb.write_status(conn, with_images("node-a", A, B))  # type: ignore[arg-type]
        assert [r["digest"] for r in hostdb.read_image_cache(conn, "node-a")] == [A, B]
        assert hostdb.read_image_cache(conn, "node-b") == []  # RLS: another node's rows are invisible
        hostdb.write_status(conn, with_images("node-a", B))  # type: ignore[arg-type]  # A was evicted
        rows = hostdb.read_image_cache(conn, "node-a")
        assert [(r["digest"], r["size_bytes"]) for r in rows] == [(B, 1000)]
        details = conn.execute("SELECT details FROM host_status WHERE node_name = 'node-a'").fetchone()
        assert details is not None and details[0]["images"]["cached"][0]["in_use"] is True
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO node_image_cache (node_name, digest_sha256, size_bytes, last_used_at)"
                " VALUES ('node-b', %s, 1, now())",
                (A,),
            )
    with connections.connect(db_url, autocommit=True) as conn:
        observed = live.observe(conn)
        assert dict(observed.image_cache) == {"node-a": frozenset({B}), "node-b": frozenset({C})}


def test_a_malformed_report_is_refused_by_the_database(db_url: str) -> None:
    with hostdb.connect(db_url) as conn:
        add_node(conn, "node-a")
        central_plans.store(conn, [plan("node-a")])
        bad = dataclasses.replace(
            status("node-a"), images=ImageCacheReport(entries=(CacheEntry("not-a-digest", "/x", 1, 0.0),))
        )
        with pytest.raises(GpuaasError):
            hostdb.write_status(conn, bad)
        assert hostdb.read_image_cache(conn, "node-a") == []  # the whole status transaction rolled back
