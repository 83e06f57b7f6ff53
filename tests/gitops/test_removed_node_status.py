"""A node removed from git while holding claims stays visible in `status` (issue 26).

Regression: the node vanished from the `status` node list and its claimed
units from the capacity totals, with no warning, while its tenants' VMs ran on.
"""

from __future__ import annotations

import json

import pytest

from reconciler import cli
from reconciler.service import reads, statuscache
from reconciler.store import connections
from tests.gitops.conftest import Repo, claims

S01, S02 = "h200-use1-s01", "h200-use1-s02"


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_removed_node_with_claims_is_named_and_counted(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(fleet_repo.root)
    fleet_repo.request("alloc-a", 2)
    assert _cli(capsys, "apply", root, "--db-url", db_url)[0] == 0
    node = claims(conn, "alloc-a")[0][0]
    other = S02 if node == S01 else S01
    rc, out, _ = _cli(capsys, "status", "--db-url", db_url, "-o", "json")
    before = next(o for o in json.loads(out)["capacity"] if o["sku"] == "h200-sxm-slice")
    assert (before["total"], before["in_use"]) == (16, 2)

    fleet_repo.remove(f"nodes/{node}.yaml")
    fleet_repo.remove(f"slotmaps/{node}.yaml")
    fleet_repo.commit(f"{node} removed")
    rc, _, err = _cli(capsys, "apply", root, "--db-url", db_url)
    assert rc == 0, err
    assert [s for _, _, s in claims(conn, "alloc-a")] == ["reserved", "reserved"]  # nothing released them

    rc, out, _ = _cli(capsys, "status", "--db-url", db_url, "-o", "json")
    doc = json.loads(out)
    assert doc["removed_nodes"] == [node]
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert set(nodes) == {node, other}
    assert nodes[node]["removed"] is True and nodes[node]["allocations"] == ["alloc-a"]
    assert nodes[node]["slots"] == {"reserved": 2}
    offer = next(o for o in doc["capacity"] if o["sku"] == "h200-sxm-slice")
    assert (offer["total"], offer["in_use"], offer["removed_in_use"]) == (10, 2, 2)
    assert offer["usable"] == 8  # the removed node's free slots are not for sale
    rc, text, _ = _cli(capsys, "status", "--db-url", db_url)
    assert (
        f"warning: nodes removed from git still hold claims (their allocations run on; release them, then "
        f"remove the node): {node}" in text
    )
    assert "REMOVED from git; 2 live claim(s) of alloc-a remain" in text
    assert "2 in use on node(s) removed from git" in text
    api = statuscache.status_document(conn)  # what the service's status endpoints serve
    assert api["removed_nodes"] == [node] and node in {n["name"] for n in api["nodes"]}
    grid = {n["name"]: n for n in reads.nodes(conn)["items"]}  # the API's and the dashboard's node list
    assert grid[node]["removed"] is True and grid[node]["allocations"] == 1 and grid[other]["removed"] is False
