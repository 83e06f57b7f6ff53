"""The loop's observed state, kept between revisions, equals a fresh full read ([perf2]).

`live.observe(conn, memory)` re-reads only the allocations and nodes the
change log (0086) names since its last read. After every kind of change the
planner observes (claims placed and released, wipes proven, host health,
firmware, drift, image cache, quarantine, profile debts, failed attempts and
their retired claims), the warm value must equal `live.observe(conn)`, and it
must really have been warm (no silent full read). Doubt reads everything.
"""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from reconciler.store import connections, live
from tests.gitops.conftest import NODES, LoopRun, Repo, prove_wipe

S01, S02 = NODES


def _same(conn: connections.Connection, memory: live.Memory) -> None:
    warm, cold = live.observe(conn, memory), live.observe(conn)
    assert warm == cold
    assert memory.full_reads == 1, "a refresh must not fall back to a full read"


def _drift(code: str, slot: int | None) -> dict[str, object]:
    return {"code": code, "message": code, "slot_index": slot}


def test_warm_observe_equals_cold_after_every_change_kind(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    fleet_repo.request("a-1")
    loop.step()
    fleet_repo.request("a-2", gpus=2, tenant="beta")
    loop.step()
    memory = loop.loop.observed
    assert memory.full_reads == 1 and memory.refreshes >= 1  # the second revision was a refresh
    assert live.observe(conn, memory) == live.observe(conn)
    assert {c.allocation_id for c in memory.last.claims if memory.last} == {"a-1", "a-2"}

    # The loop itself: a release moves claims to releasing, a proven wipe frees them.
    fleet_repo.release("a-1")
    loop.step()
    _same(conn, memory)
    assert prove_wipe(conn, "a-1") == 1
    loop.step()
    _same(conn, memory)

    # Host reports: health, firmware, node and slot drift, a failed wipe.
    conn.execute("INSERT INTO host_status (node_name, healthy, firmware_ready) VALUES (%s, false, true)", (S01,))
    _same(conn, memory)
    conn.execute("UPDATE host_status SET healthy = true, firmware_ready = false WHERE node_name = %s", (S01,))
    _same(conn, memory)
    conn.execute(
        "UPDATE host_status SET drift = %s WHERE node_name = %s", (Jsonb([_drift("drift.identity.changed", None)]), S01)
    )
    _same(conn, memory)
    conn.execute(
        "INSERT INTO host_slot_status (node_name, slot_index, vm_state, drift) VALUES (%s, 3, 'absent', %s)",
        (S02, Jsonb([_drift("drift.pci.not_vfio", 3)])),
    )
    _same(conn, memory)
    conn.execute("UPDATE host_slot_status SET wipe_state = 'failed' WHERE node_name = %s AND slot_index = 3", (S02,))
    _same(conn, memory)
    conn.execute("DELETE FROM host_slot_status WHERE node_name = %s", (S02,))
    _same(conn, memory)
    # A heartbeat changes nothing the planner reads: no change is logged for it.
    before = conn.execute("SELECT count(*) FROM observed_changes").fetchone()
    conn.execute("UPDATE host_status SET reported_at = now(), observed_generation = 7 WHERE node_name = %s", (S01,))
    assert conn.execute("SELECT count(*) FROM observed_changes").fetchone() == before

    # Image cache, quarantine, profile debts.
    conn.execute(
        "INSERT INTO node_image_cache (node_name, digest_sha256, size_bytes, last_used_at) VALUES (%s, %s, 1, now())",
        (S02, "a" * 64),
    )
    _same(conn, memory)
    conn.execute(
        "INSERT INTO machine_quarantine (node_name, provider, machine_id, allocation_id, code, message)"
        " VALUES (%s, 'fake', 'm-1', 'a-2', 'lease.deploy.failed', 'x')",
        (S02,),
    )
    _same(conn, memory)
    fleet_repo.request("a-3")  # a commit that changes only allocations: the node facts are handed on
    loop.step()
    _same(conn, memory)
    assert memory.last is not None and S02 in memory.last.unavailable_nodes
    conn.execute("INSERT INTO node_profile_debts (node_name, allocation_id) VALUES (%s, 'a-2')", (S01,))
    _same(conn, memory)
    conn.execute("DELETE FROM machine_quarantine")
    conn.execute("DELETE FROM node_profile_debts")
    conn.execute("DELETE FROM node_image_cache")
    _same(conn, memory)

    # A failed attempt: its claims retired (still releasing on the failed node), the allocation pending again.
    node, kind = conn.execute(
        "SELECT n.name, c.claim_kind FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
        " WHERE c.allocation_id = 'a-2' LIMIT 1"
    ).fetchone() or ("", "")
    with conn.transaction():
        conn.execute(
            "INSERT INTO allocation_attempts (allocation_id, attempt, node, claim_kind, code, message, quarantined,"
            " outcome) VALUES ('a-2', 1, %s, %s, 'provision.failed', 'x', false, 'rescheduled')",
            (node, kind),
        )
        conn.execute(
            "INSERT INTO retired_claims (claim_id, allocation_id, attempt)"
            " SELECT id, allocation_id, 1 FROM allocation_resource_claims WHERE allocation_id = 'a-2'"
        )
        conn.execute("UPDATE allocations SET status = 'pending' WHERE id = 'a-2'")
    _same(conn, memory)
    assert memory.last is not None and memory.last.avoid == {"a-2": frozenset({node})}
    assert "a-2" not in memory.last.placed


def test_doubt_reads_everything_again(fleet_repo: Repo, loop: LoopRun, conn: connections.Connection) -> None:
    fleet_repo.request("a-1")
    loop.step()
    memory = live.Memory()
    live.observe(conn, memory)
    live.observe(conn, memory)
    assert (memory.full_reads, memory.refreshes) == (1, 1)
    # The change log pruned past the watermark (or a watched table truncated): everything again.
    conn.execute("UPDATE observed_horizon SET xid = pg_current_xact_id()")
    live.observe(conn, memory)
    assert memory.full_reads == 2 and "pruned" in memory.doubt
    # Another session on the same database: still warm.
    with connections.connect(conn.info.dsn, autocommit=True) as other:
        assert live.observe(other, memory) == live.observe(conn)
    assert memory.full_reads == 2
    # Inside a transaction its own writes are visible and may roll back: nothing of that read is kept.
    with conn.transaction():
        conn.execute("INSERT INTO host_status (node_name, healthy) VALUES (%s, false)", (S01,))
        assert S01 in live.observe(conn, memory).unavailable_nodes
        raise psycopg.Rollback()
    assert live.observe(conn, memory) == live.observe(conn)
    assert S01 not in live.observe(conn, memory).unavailable_nodes
    assert memory.full_reads == 3
    # Read from another database (or server, or a re-created change log): everything again.
    memory.source = ("another", "database")
    live.observe(conn, memory)
    assert memory.full_reads == 4 and "another database" in memory.doubt


def test_a_missed_change_kind_is_seen_by_the_comparison(
    fleet_repo: Repo, loop: LoopRun, conn: connections.Connection
) -> None:
    """The warm == cold check is not vacuous: with a change log trigger off, the refresh misses it."""
    fleet_repo.request("a-1")
    loop.step()
    memory = live.Memory()
    live.observe(conn, memory)
    conn.execute("ALTER TABLE host_status DISABLE TRIGGER observed_insert")
    conn.execute("INSERT INTO host_status (node_name, healthy) VALUES (%s, false)", (S01,))
    assert live.observe(conn, memory) != live.observe(conn)


def test_the_machine_provider_check_follows_the_node_documents() -> None:
    """Per commit, whether any node declares a machine is not a walk over every node when no Node
    document changed; a Node change, or a state not read from the last one, is looked at again."""
    import weakref

    from desired import models as m
    from desired.state import Delta, DesiredState
    from gpuaas_tools.bench import synthetic
    from reconciler.reconcile import reconciling

    plain = synthetic.fleet(nodes=2)
    assert reconciling._declares_machines(plain, None) is False
    name, node = next(iter(plain.nodes.items()))
    leased = m.NodeMachine(provider="maas", machine_id="abc")
    with_machine = DesiredState(
        **{**vars_of(plain), "nodes": {**plain.nodes, name: node.model_copy(update={"machine": leased})}}
    )
    # Read from `plain` with a Node change: looked at again.
    assert reconciling._declares_machines(with_machine, Delta(weakref.ref(plain), frozenset({("Node", name)}))) is True
    # An allocation commit on top: the answer carries over (no node was looked at: the nodes are not even read).
    after = DesiredState(**{**vars_of(with_machine), "nodes": _Exploding()})
    assert (
        reconciling._declares_machines(after, Delta(weakref.ref(with_machine), frozenset({("Allocation", "a")})))
        is True
    )
    # Read from a state that is not the last one asked about, or not read by delta: looked at again.
    again = DesiredState(**vars_of(plain))
    assert reconciling._declares_machines(again, Delta(weakref.ref(with_machine), frozenset())) is False
    assert reconciling._declares_machines(with_machine, None) is True


class _Exploding(dict):  # type: ignore[type-arg]
    def values(self):  # type: ignore[no-untyped-def]
        raise AssertionError("every node walked although no Node document changed")


def vars_of(state: object) -> dict[str, object]:
    import dataclasses

    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}  # type: ignore[arg-type]
