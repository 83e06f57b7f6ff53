"""`gpuaas apply --rev` never goes back silently (issue 26).

Regression: `gpuaas apply --rev HEAD~3` applied an old revision without a
word: three allocations left the inventory and a placed one became orphaned.
Now a commit that does not descend from the applied one is refused with
`apply.rewind`, listing what would leave, unless `--allow-rewind`.
"""

from __future__ import annotations

import shutil

import pytest

from reconciler import cli
from reconciler.store import connections, revisions
from tests.gitops.conftest import EXAMPLE, Repo, claims, history_rows


def _apply(capsys: pytest.CaptureFixture[str], db_url: str, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["apply", *args, "--db-url", db_url])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _present(conn: connections.Connection) -> tuple[list[str], list[str]]:
    allocs = [str(r[0]) for r in conn.execute("SELECT id FROM allocations WHERE present ORDER BY id").fetchall()]
    nodes = [str(r[0]) for r in conn.execute("SELECT name FROM nodes WHERE present ORDER BY name").fetchall()]
    return allocs, nodes


@pytest.fixture
def applied(fleet_repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    """base fleet <- node b01 added <- three requests, HEAD applied: (the base commit, HEAD)."""
    base = str(fleet_repo.repo.head.commit.hexsha)
    shutil.copy(EXAMPLE / "nodes/h200-use1-b01.yaml", fleet_repo.root / "nodes/h200-use1-b01.yaml")
    fleet_repo.commit("node b01")
    for aid in ("alloc-a", "alloc-b", "alloc-c"):
        head = fleet_repo.request(aid, 1)
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root))
    assert rc == 0, err
    return base, head


def test_an_older_revision_is_refused_with_what_would_leave(
    fleet_repo: Repo,
    db_url: str,
    conn: connections.Connection,
    capsys: pytest.CaptureFixture[str],
    applied: tuple[str, str],
) -> None:
    base, head = applied
    before = _present(conn), claims(conn, "alloc-a"), history_rows(conn)
    rc, out, err = _apply(capsys, db_url, str(fleet_repo.root), "--rev", "HEAD~4")
    assert rc == 1 and out == ""
    assert f"error: apply.rewind: revision {base[:12]} does not descend from the applied revision {head[:12]}" in err
    assert "3 allocation(s) would leave the inventory, 3 of them placed (orphaned), and 1 node(s)" in err
    assert "--allow-rewind" in err and "Traceback" not in err
    for aid in ("alloc-a", "alloc-b", "alloc-c"):
        assert f"  allocation {aid} leaves the inventory (holds claims: orphaned, nothing releases it)" in err
    assert "  node h200-use1-b01 leaves the inventory" in err
    # nothing written: inventory, claims and history as they were
    assert (_present(conn), claims(conn, "alloc-a"), history_rows(conn)) == before
    assert revisions.latest_applied(conn) == head


def test_another_line_of_history_is_refused_too(
    fleet_repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str], applied: tuple[str, str]
) -> None:
    base, _ = applied
    fleet_repo.repo.git.checkout("-b", "other", base)
    fleet_repo.request("alloc-z", 1)
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root))
    assert rc == 1 and "apply.rewind" in err and "allocation alloc-a leaves the inventory" in err


def test_allow_rewind_applies_it_and_says_what_left(
    fleet_repo: Repo,
    db_url: str,
    conn: connections.Connection,
    capsys: pytest.CaptureFixture[str],
    applied: tuple[str, str],
) -> None:
    base, head = applied
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root), "--rev", base, "--allow-rewind")
    assert rc == 0, err
    assert f"warning: revision {base[:12]} does not descend from the applied revision {head[:12]}" in err
    assert _present(conn) == ([], ["h200-use1-s01", "h200-use1-s02"])
    assert revisions.latest_applied(conn) == base
    assert history_rows(conn)[-1] == (base, f"cli {fleet_repo.root} (rewind from {head[:12]})", "changed")


def test_a_descendant_and_the_same_revision_apply_as_before(
    fleet_repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str], applied: tuple[str, str]
) -> None:
    assert _apply(capsys, db_url, str(fleet_repo.root), "--rev", "HEAD")[0] == 0
    fleet_repo.request("alloc-d", 1)
    rc, _, err = _apply(capsys, db_url, str(fleet_repo.root))
    assert rc == 0 and "rewind" not in err
