"""Real git repositories and a real PostgreSQL for the GitOps loop tests.

`fleet_repo` is a small desired-state repo cut from examples/fleet:

    us-east-1 / h200-slice
      h200-use1-s01  8 slots  numa0 [0 1 2 3]  numa1 [4 5 6 7]   slice-capable
      h200-use1-s02  8 slots  numa0 [0 1 2 3]  numa1 [4 5 6 7]   slice-capable

no baremetal nodes and no allocations; the portal bot (`reconciler.reconcile.requests`)
adds allocations as commits.
"""

from __future__ import annotations

import datetime as dt
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import git
import pytest
from psycopg.types.json import Jsonb

from reconciler.loop import heads, watching
from reconciler.reconcile import requests
from reconciler.store import connections

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
NODES = ("h200-use1-s01", "h200-use1-s02")
SKU = "h200-sxm-slice"
REGION = "us-east-1"
PEOPLE = git.Actor("operator", "operator@example.com")
T0 = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.UTC)


@dataclass
class Repo:
    root: Path
    repo: git.Repo
    clock: list[int] = field(default_factory=lambda: [0])

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}"
        path.write_text(text.replace(old, new))

    def remove(self, rel: str) -> None:
        self.repo.index.remove([rel], working_tree=True)

    def commit(self, message: str) -> str:
        self.repo.git.add("-A")
        return str(self.repo.index.commit(message, author=PEOPLE, committer=PEOPLE).hexsha)

    def request(self, allocation_id: str, gpus: int = 1, *, tenant: str = "acme") -> str:
        """The portal bot's request, committed; each one a minute after the last (placement order)."""
        self.clock[0] += 1
        written = requests.create(
            self.root,
            tenant=tenant,
            sku=SKU,
            gpus=gpus,
            region=REGION,
            allocation_id=allocation_id,
            now=T0 + dt.timedelta(minutes=self.clock[0]),
            commit=True,
        )
        assert written.commit is not None
        return written.commit

    def release(self, allocation_id: str) -> str:
        written = requests.release(self.root, allocation_id, commit=True)
        assert written.commit is not None
        return written.commit

    def drain(self, node: str, state: str = "draining") -> str:
        text = (self.root / f"nodes/{node}.yaml").read_text()
        current = next(line for line in text.splitlines() if line.startswith("admin_state:"))
        self.edit(f"nodes/{node}.yaml", current, f"admin_state: {state}")
        return self.commit(f"{node}: admin_state {state}")


def make_fleet(root: Path, nodes: tuple[str, ...] = NODES) -> None:
    root.mkdir(parents=True)
    shutil.copy(EXAMPLE / "fleet.yaml", root / "fleet.yaml")
    shutil.copytree(EXAMPLE / "skus", root / "skus")
    shutil.copytree(EXAMPLE / "images", root / "images")
    for sub in ("nodes", "slotmaps"):
        (root / sub).mkdir()
        for node in nodes:
            shutil.copy(EXAMPLE / sub / f"{node}.yaml", root / sub / f"{node}.yaml")


@pytest.fixture
def fleet_repo(tmp_path: Path) -> Iterator[Repo]:
    root = tmp_path / "desired"
    make_fleet(root)
    r = Repo(root, git.Repo.init(root, initial_branch="main"))
    r.commit("base fleet")
    yield r
    r.repo.close()  # its git processes end with the test, not in a later test's garbage collection


@pytest.fixture
def conn(db_url: str) -> Iterator[connections.Connection]:
    with connections.connect(db_url, autocommit=True) as c:
        yield c


@dataclass
class LoopRun:
    loop: watching.Loop
    events: list[watching.Event]
    stop: threading.Event

    def step(self) -> watching.Event | None:
        return self.loop.step()


def make_loop(repo: Repo, db_url: str, *, interval: float = 3600.0) -> LoopRun:
    stop = threading.Event()
    events: list[watching.Event] = []
    source = heads.LocalHead(repo.root, stop)
    loop = watching.Loop(
        repo.root,
        source,
        lambda: connections.connect(db_url, autocommit=True),
        stop=stop,
        interval=interval,
        log=events.append,
    )
    return LoopRun(loop, events, stop)


@pytest.fixture
def loop(fleet_repo: Repo, db_url: str) -> Iterator[LoopRun]:
    run = make_loop(fleet_repo, db_url)
    yield run
    run.loop.close()
    run.loop.source.close()


def claims(conn: connections.Connection, allocation_id: str) -> list[tuple[str, int | None, str]]:
    rows = conn.execute(
        "SELECT n.name, c.slot_index, c.status FROM allocation_resource_claims c"
        " JOIN nodes n ON n.id = c.node_id WHERE c.allocation_id = %s"
        " ORDER BY c.slot_index",
        (allocation_id,),
    ).fetchall()
    return [(str(n), i, str(s)) for n, i, s in rows]


def slot_statuses(conn: connections.Connection, node: str) -> dict[int, str]:
    rows = conn.execute(
        "SELECT s.slot_index, s.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
        " WHERE n.name = %s ORDER BY s.slot_index",
        (node,),
    ).fetchall()
    return {int(i): str(s) for i, s in rows}


def allocation_status(conn: connections.Connection, allocation_id: str) -> tuple[str, str | None]:
    row = conn.execute("SELECT status, pending_code FROM allocations WHERE id = %s", (allocation_id,)).fetchone()
    assert row is not None, allocation_id
    return str(row[0]), row[1]


def prove_wipe(conn: connections.Connection, allocation_id: str) -> int:
    """What a host reports after wiping a released allocation's disks: verified evidence per slot."""
    rows = conn.execute(
        "SELECT n.name, c.slot_index, c.resource_snapshot -> 'slot' ->> 'nvme_device'"
        " FROM allocation_resource_claims c JOIN nodes n ON n.id = c.node_id"
        " WHERE c.allocation_id = %s AND c.status = 'releasing'",
        (allocation_id,),
    ).fetchall()
    for node, idx, device in rows:
        evidence = {"device": device, "signature_clear": True, "sampled_zero": True}
        conn.execute(
            "INSERT INTO host_slot_status (node_name, slot_index, vm_state, wipe_allocation_id, wipe_state,"
            " wipe_evidence, wipe_reported_at, updated_at)"
            " VALUES (%s, %s, 'absent', %s, 'verified', %s, clock_timestamp(), clock_timestamp())"
            " ON CONFLICT (node_name, slot_index) DO UPDATE SET vm_state = 'absent',"
            " wipe_allocation_id = EXCLUDED.wipe_allocation_id, wipe_state = 'verified',"
            " wipe_evidence = EXCLUDED.wipe_evidence, wipe_reported_at = clock_timestamp(),"
            " updated_at = clock_timestamp()",
            (node, idx, allocation_id, Jsonb(evidence)),
        )
    return len(rows)


def history_rows(conn: connections.Connection) -> list[tuple[str | None, str, str]]:
    rows = conn.execute("SELECT revision, source, result FROM reconciliations ORDER BY id").fetchall()
    return [(r, str(s), str(res)) for r, s, res in rows]
