"""Host plans written as sets (reconciler.store.hostplans): batches, concurrent writers, one bump per change."""

from __future__ import annotations

import threading

import pytest

from desired.state import DesiredState
from reconciler.store import claims, connections, hostplans
from reconciler.store.connections import Connection
from schemas import hostplans as codec
from schemas import progress
from tests.claims.test_apply import slice_placement

NODE = "node-00000"


def _generations(conn: Connection) -> dict[str, int]:
    return {str(n): int(g) for n, g in conn.execute("SELECT node_name, generation FROM host_plans")}


@pytest.mark.parametrize("copy_from", [1, 10**9], ids=["copy", "arrays"])
def test_batches_write_every_node_once_and_count_progress(
    conn: Connection, fleet: DesiredState, monkeypatch: pytest.MonkeyPatch, copy_from: int
) -> None:
    monkeypatch.setattr(hostplans, "BATCH", 2)  # six nodes: three transactions
    monkeypatch.setattr(hostplans, "COPY_FROM", copy_from)  # staged by COPY, or sent as arrays
    phase = progress.Phase("write host plans")
    written = hostplans.write(conn, shown=phase)
    assert sorted(w.node for w in written) == sorted(fleet.nodes)
    assert all(w.changed and w.generation == 1 for w in written)
    assert (phase.done, phase.total) == (6, 6)
    again = hostplans.write(conn)
    assert not any(w.changed for w in again) and _generations(conn) == dict.fromkeys(fleet.nodes, 1)
    for w in again:  # the stored document carries the row's generation
        plan = hostplans.read(conn, w.node)
        assert plan is not None and plan.generation == 1


def test_concurrent_writers_bump_a_changed_plan_once(conn: Connection, fleet: DesiredState, db_url: str) -> None:
    hostplans.write(conn)
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (1,))).placed
    errors: list[BaseException] = []
    order = [sorted(fleet.nodes), sorted(fleet.nodes, reverse=True)]

    def writer(nodes: list[str]) -> None:
        try:
            with connections.connect(db_url, autocommit=True) as mine:
                for _ in range(3):
                    hostplans.write(mine, nodes)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(nodes,)) for nodes in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    generations = _generations(conn)
    assert generations.pop(NODE) == 2  # one change, one bump, whoever wrote it
    assert set(generations.values()) == {1}
    plan = hostplans.read(conn, NODE)
    assert plan is not None and [v.allocation_id for v in plan.vms] == ["alloc-0000000"]


def test_a_cold_batch_goes_straight_in_with_the_specs_the_upsert_stores(
    conn: Connection, fleet: DesiredState, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    """Nodes without a plan yet are COPYed into host_plans (generation 1), each host told by NOTIFY.

    Their documents are made straight from the slot rows (`_spec`), not through the
    codec's dataclasses: the stored specs are still exactly the upsert's, VMs included."""
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (1,))).placed  # a claim before any plan
    monkeypatch.setattr(hostplans, "COPY_FROM", 1)
    with connections.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN gpuaas_host_plan")
        written = hostplans.write(conn)
        notes = {n.payload for n in listener.notifies(timeout=10, stop_after=len(fleet.nodes))}
    assert all(w.changed and w.generation == 1 for w in written)
    assert notes == {f"{n}:1" for n in fleet.nodes}
    cold = {str(n): str(s) for n, s in conn.execute("SELECT node_name, spec::text FROM host_plans")}
    conn.execute("DELETE FROM host_plans")
    monkeypatch.setattr(hostplans, "COPY_FROM", 10**9)  # the same plans through the upsert
    hostplans.write(conn)
    assert {str(n): str(s) for n, s in conn.execute("SELECT node_name, spec::text FROM host_plans")} == cold
    plan = hostplans.read(conn, NODE)
    assert plan is not None and plan.generation == 1
    assert [v.allocation_id for v in plan.vms] == ["alloc-0000000"]
    smap = fleet.slot_maps[NODE]
    assert {i.slot_index: i.nvme_identity for i in plan.disk_identities} == {
        s.slot_index: codec.DiskIdentity.from_dict(s.nvme_identity.model_dump(exclude_none=True))
        for s in smap.slots
        if s.nvme_identity is not None
    }
    assert plan.disk_identities  # the fleet records identities: the columns were read


def test_plan_specs_are_compressed_with_lz4(conn: Connection) -> None:
    """Every spec is compressed on write and decompressed on compare and read: lz4, where the server has it."""
    found = conn.execute(
        "SELECT attcompression FROM pg_attribute WHERE attrelid = 'host_plans'::regclass AND attname = 'spec'"
    ).fetchone()
    assert found == ("l",)


def _spy_batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Which session wrote which batch: (id of the connection, first node)."""
    seen: list[tuple[int, str]] = []
    real = hostplans._write_batch

    def spy(c: Connection, batch: list[str], pins: tuple[str, ...], revision: str | None) -> list[hostplans.Written]:
        seen.append((id(c), batch[0]))
        return real(c, batch, pins, revision)

    monkeypatch.setattr(hostplans, "_write_batch", spy)
    return seen


def test_batches_alternate_between_two_sessions_and_store_what_one_session_stores(
    conn: Connection, fleet: DesiredState, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    """With a second session (`connect`), the odd batches are written there while this one writes the even:
    the same plans, in the same order, as one session writing every batch; the second session is closed."""
    assert claims.place(conn, slice_placement("alloc-0000000", NODE, (1,))).placed
    monkeypatch.setattr(hostplans, "BATCH", 2)  # six nodes: three batches, one of them on the second session
    monkeypatch.setattr(hostplans, "COPY_FROM", 1)
    opened: list[Connection] = []

    def connect() -> Connection:
        opened.append(connections.connect(db_url, autocommit=True))
        return opened[-1]

    seen = _spy_batches(monkeypatch)
    phase = progress.Phase("write host plans")
    written = hostplans.write(conn, shown=phase, connect=connect)
    assert len(opened) == 1 and opened[0].closed
    nodes = sorted(fleet.nodes)
    assert sorted(seen, key=lambda s: s[1]) == [
        (id(conn), nodes[0]),
        (id(opened[0]), nodes[2]),
        (id(conn), nodes[4]),
    ]
    assert (phase.done, phase.total) == (6, 6)
    two = {
        str(n): (int(g), str(s)) for n, g, s in conn.execute("SELECT node_name, generation, spec::text FROM host_plans")
    }
    conn.execute("DELETE FROM host_plans")
    assert hostplans.write(conn) == written  # one session: the same answer
    one = {
        str(n): (int(g), str(s)) for n, g, s in conn.execute("SELECT node_name, generation, spec::text FROM host_plans")
    }
    assert one == two and set(one) == set(nodes)


def test_a_failed_batch_on_the_second_session_is_raised_and_stops_the_write(
    conn: Connection, fleet: DesiredState, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    monkeypatch.setattr(hostplans, "BATCH", 1)  # six batches: three on each side
    opened: list[Connection] = []

    def connect() -> Connection:
        opened.append(connections.connect(db_url, autocommit=True))
        return opened[-1]

    seen: list[tuple[int, str]] = []
    real = hostplans._write_batch

    def spy(c: Connection, batch: list[str], pins: tuple[str, ...], revision: str | None) -> list[hostplans.Written]:
        seen.append((id(c), batch[0]))
        if c is not conn:
            raise RuntimeError("the second session's batch failed")
        return real(c, batch, pins, revision)

    monkeypatch.setattr(hostplans, "_write_batch", spy)
    with pytest.raises(RuntimeError, match="second session"):
        hostplans.write(conn, connect=connect)
    assert opened and opened[0].closed
    assert sum(1 for c, _ in seen if c != id(conn)) == 1  # the failing side stopped at its first batch
    # each batch is its own transaction: the failed one left nothing, the other side's stand (as one session's would)
    nodes = sorted(fleet.nodes)
    stored = {str(n) for (n,) in conn.execute("SELECT node_name FROM host_plans")}
    assert stored <= {nodes[0], nodes[2], nodes[4]} and nodes[1] not in stored
