"""Soak: one long-lived loop through 100+ revisions of every kind (issue 18).

One `watching.Loop` (one process, one database session) sees baremetal and
slice requests of every size in random order, releases with wipe proof,
drains and returns to service, inventory edits and invalid commits. After
every step the revision in force is the newest valid commit, the loop never
reported an error, and `gpuaas db check` holds. Restart-heavy tests (the
kill tests) hide a wedged session; this one keeps the session for the whole
run. Midway, the database is restored under the running loop from a backup
taken revisions earlier (pg_dump / pg_restore --clean, issue 26): within
one retry tick the loop brings the store back to the newest valid commit.

    us-east-1
      h200-use1-s01, h200-use1-s02, h200-use1-c01   slice nodes, 8 slots each
      h200-use1-b01                                  baremetal only
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from reconciler.loop import watching
from reconciler.reconcile import requests
from reconciler.store import checks, connections, revisions
from tests.gitops.conftest import EXAMPLE, T0, LoopRun, Repo, make_fleet, make_loop, prove_wipe

SLICE_NODES = ("h200-use1-s01", "h200-use1-s02", "h200-use1-c01")
BAREMETAL_NODE = "h200-use1-b01"
BAREMETAL_SKU = "h200-sxm-baremetal-8g"
REVISIONS = 110
BACKUP_AT, RESTORE_AT = 30, 38  # steps: the backup, and its restore under the loop
PG_BIN = Path("/usr/lib/postgresql/15/bin")


@pytest.fixture
def soak_repo(tmp_path: Path) -> Iterator[Repo]:
    root = tmp_path / "desired"
    make_fleet(root, SLICE_NODES)
    shutil.copy(EXAMPLE / "nodes" / f"{BAREMETAL_NODE}.yaml", root / "nodes" / f"{BAREMETAL_NODE}.yaml")
    r = Repo(root, git.Repo.init(root, initial_branch="main"))
    r.commit("base fleet")
    yield r
    r.repo.close()


@pytest.fixture
def soak_loop(soak_repo: Repo, db_url: str) -> Iterator[LoopRun]:
    run = make_loop(soak_repo, db_url, interval=3600.0)
    yield run
    run.loop.close()
    run.loop.source.close()


class Story:
    """Random but seeded operator, portal and CI traffic against one repo."""

    def __init__(self, repo: Repo, conn: connections.Connection, seed: int) -> None:
        self.repo, self.conn, self.rng = repo, conn, random.Random(seed)  # noqa: S311 - test randomness
        self.live: list[str] = []  # allocation ids declared present
        self.drained: set[str] = set()
        self.broken = False
        self.n = 0
        self.valid_head: str | None = None
        self.kinds: dict[str, int] = {}

    def request(self, sku: str, gpus: int) -> str:
        self.n += 1
        aid = f"soak-{self.n:04d}"
        w = requests.create(
            self.repo.root,
            tenant="acme",
            sku=sku,
            gpus=gpus,
            region="us-east-1",
            allocation_id=aid,
            now=T0 + dt.timedelta(minutes=self.n),
            commit=True,
        )
        assert w.commit is not None
        self.live.append(aid)
        return w.commit

    def one(self) -> tuple[str, str]:  # noqa: PLR0911 - one return per kind of commit
        """Make one commit; returns (what, sha)."""
        if self.broken:  # CI let a broken file through: the next commit fixes it
            self.repo.remove("allocations/zz-broken.yaml")
            self.broken = False
            return "fix", self.repo.commit("remove the broken file")
        if self.n == 0:  # the order that wedged the loop: a baremetal lease first, slices after it
            return "baremetal", self.request(BAREMETAL_SKU, 8)
        roll = self.rng.random()
        if roll < 0.30:
            gpus = self.rng.choice((1, 1, 2, 2, 4, 8))
            return f"slice-{gpus}", self.request("h200-sxm-slice", gpus)
        if roll < 0.42:
            return "baremetal", self.request(BAREMETAL_SKU, 8)
        if roll < 0.65 and self.live:
            aid = self.live.pop(self.rng.randrange(len(self.live)))
            return "release", self.repo.release(aid)
        if roll < 0.75:
            node = self.rng.choice((*SLICE_NODES, BAREMETAL_NODE))
            state = "active" if node in self.drained else "draining"
            self.drained.symmetric_difference_update({node})
            return f"admin-{state}", self.repo.drain(node, state)
        if roll < 0.88:
            node = self.rng.choice(SLICE_NODES)
            rel = f"nodes/{node}.yaml"
            text = (self.repo.root / rel).read_text()
            tag = "server-dell-xe9680l"
            new = text.replace(f", {tag}]", "]") if f", {tag}]" in text else text.replace("]", f", {tag}]", 1)
            (self.repo.root / rel).write_text(new)
            return "inventory", self.repo.commit(f"{node}: hardware tags")
        self.repo.write("allocations/zz-broken.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: [\n")
        self.broken = True
        return "invalid", self.repo.commit("a broken allocation file")


def test_one_loop_applies_every_kind_of_revision_without_wedging(
    soak_repo: Repo, soak_loop: LoopRun, conn: connections.Connection, db_url: str, tmp_path: Path
) -> None:
    loop = soak_loop.loop
    first = loop.step()
    assert first is not None and first.kind == "applied"
    session = loop.conn
    story = Story(soak_repo, conn, seed=18)
    newest_valid = first.revision
    for step in range(REVISIONS):
        what, sha = story.one()
        story.kinds[what.split("-")[0]] = story.kinds.get(what.split("-")[0], 0) + 1
        event = loop.step()
        assert event is not None and event.revision == sha, (step, what, event)
        assert event.kind == ("invalid" if what == "invalid" else "applied"), (step, what, event.render())
        if what != "invalid":
            newest_valid = sha
        # Hosts prove their wipes; the periodic retry frees the slots (and places what waited).
        if prove_wipe_all(conn):
            loop.next_retry = 0.0
            retried = loop.step()
            assert retried is None or retried.kind == "retried", (step, retried)
        assert revisions.latest_applied(conn) == newest_valid, (step, what)
        assert checks.run(conn) == [], (step, what)
        if step == BACKUP_AT:
            subprocess.run(
                [str(PG_BIN / "pg_dump"), "-Fc", "-f", str(tmp_path / "backup.dump"), "-d", db_url],
                check=True,
                timeout=300,
            )
        if step == RESTORE_AT:
            _restore_under_the_loop(loop, conn, db_url, tmp_path / "backup.dump", newest_valid)
            session = loop.conn  # re-converging opened a fresh one on purpose; that one lasts to the end
    assert not [e for e in soak_loop.events if e.kind == "error"], [e.render() for e in soak_loop.events]
    assert loop.conn is session and loop.failing is None  # one session (since the restore): nothing was reset
    # Every kind of revision happened, baremetal and slices were both placed in this one session.
    assert {"slice", "baremetal", "release", "admin", "inventory", "invalid", "fix"} <= set(story.kinds)
    kinds = {
        str(k) for (k,) in conn.execute("SELECT DISTINCT claim_kind::text FROM allocation_resource_claims").fetchall()
    }
    assert kinds == {"slot", "node_exclusive"}


def _restore_under_the_loop(
    loop: watching.Loop, conn: connections.Connection, db_url: str, backup: Path, newest_valid: str | None
) -> None:
    subprocess.run(
        [str(PG_BIN / "pg_restore"), "--clean", "--if-exists", "--single-transaction", "-d", db_url, str(backup)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    assert revisions.latest_applied(conn) != newest_valid  # the store really went back
    loop.next_retry = 0.0  # one interval later
    event = loop.step()
    assert event is not None and event.kind == "applied" and "gitops.reconverged" in event.message, event
    assert revisions.latest_applied(conn) == newest_valid
    assert checks.run(conn) == []
    prove_wipe_all(conn)  # wipe proof the backup predates: the hosts report it again


def prove_wipe_all(conn: connections.Connection) -> int:
    """What hosts report after cleaning released allocations: wipe proof per slot, reimage proof per node."""
    slots = conn.execute(
        "SELECT DISTINCT allocation_id FROM allocation_resource_claims"
        " WHERE status = 'releasing' AND claim_kind = 'slot'"
    ).fetchall()
    proved = sum(prove_wipe(conn, str(a)) for (a,) in slots)
    nodes = conn.execute(
        "SELECT n.name, c.allocation_id FROM allocation_resource_claims c"
        " JOIN nodes n ON n.id = c.node_id"
        " WHERE c.status = 'releasing' AND c.claim_kind = 'node_exclusive'"
    ).fetchall()
    for node, aid in nodes:
        conn.execute(
            "INSERT INTO host_status (node_name, cleanup_allocation_id, cleanup_state, cleanup_evidence,"
            " cleanup_reported_at) VALUES (%s, %s, 'verified', '{}', clock_timestamp())"
            " ON CONFLICT (node_name) DO UPDATE SET cleanup_allocation_id = EXCLUDED.cleanup_allocation_id,"
            " cleanup_state = 'verified', cleanup_reported_at = clock_timestamp()",
            (node, aid),
        )
    return proved + len(nodes)
