"""Drain end to end (loop + database + status), and the capacity read model `gpuaas status` prints."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler import cli
from reconciler.commands import status
from reconciler.store import connections
from tests.gitops.conftest import LoopRun, Repo, allocation_status, claims, prove_wipe


def _node(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in doc["nodes"] if n["name"] == name)


def _slice(doc: dict[str, Any]) -> dict[str, Any]:
    return next(o for o in doc["capacity"] if o["sku"] == "h200-sxm-slice" and o["region"] == "us-east-1")


def test_draining_blocks_new_placements_only(
    fleet_repo: Repo, loop: LoopRun, db_url: str, conn: connections.Connection
) -> None:
    fleet_repo.request("req-running", 1)
    loop.step()
    ((node, idx, _),) = claims(conn, "req-running")
    assert node == "h200-use1-s01"

    fleet_repo.drain("h200-use1-s01")
    fleet_repo.request("req-small", 1)
    fleet_repo.request("req-whole", 8)
    loop.step()
    # the running allocation keeps its claim; nothing new lands on the draining node
    assert claims(conn, "req-running") == [(node, idx, "reserved")]
    assert allocation_status(conn, "req-running")[0] == "reserved"
    assert {n for n, _, _ in claims(conn, "req-small")} == {"h200-use1-s02"}
    assert allocation_status(conn, "req-whole")[0] == "pending"
    doc = status.collect(db_url)
    s01 = _node(doc, "h200-use1-s01")
    assert (s01["admin_state"], s01["mode"], s01["drained"]) == ("draining", "draining", False)
    assert s01["allocations"] == ["req-running"]
    assert _slice(doc)["not_launchable"]["draining"] == 7

    # released and cleaned: the node is drained (empty, clean, still out of placement)
    fleet_repo.release("req-running")
    loop.step()
    assert _node(status.collect(db_url), "h200-use1-s01")["slots"] == {"available": 7, "cleanup": 1}
    prove_wipe(conn, "req-running")
    loop.loop.next_retry = 0.0
    event = loop.step()
    assert event is not None and event.counts["slots_freed"] == 1
    assert allocation_status(conn, "req-whole")[0] == "pending"
    s01 = _node(status.collect(db_url), "h200-use1-s01")
    assert (s01["mode"], s01["drained"], s01["slots"], s01["allocations"]) == ("draining", True, {"available": 8}, [])

    # back to active: the node returns to available and takes the request that waited
    fleet_repo.drain("h200-use1-s01", "active")
    loop.step()
    assert {n for n, _, _ in claims(conn, "req-whole")} == {"h200-use1-s01"}
    assert _node(status.collect(db_url), "h200-use1-s01")["mode"] == "slice_active"


def test_status_counts_launchable_sizes_not_raw_slots(
    fleet_repo: Repo, loop: LoopRun, db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # s01: numa0 [0 1 2 3] numa1 [4 5 6 7]; one 1-GPU and one 2-GPU slice leave 5 free GPUs there
    fleet_repo.request("req-one", 1)
    fleet_repo.request("req-two", 2)
    loop.step()
    doc = status.collect(db_url)
    offer = _slice(doc)
    assert (offer["total"], offer["in_use"], offer["free"], offer["usable"]) == (16, 3, 13, 13)
    sizes = {s["gpu_count"]: s for s in offer["sizes"]}
    assert {g: s["launchable"] for g, s in sizes.items()} == {1: 13, 2: 6, 4: 3, 8: 1}
    assert sizes[8]["stranded_gpus"] == 5 and sizes[4]["stranded_gpus"] == 1
    allocs = {a["id"]: a for a in doc["allocations"]}
    assert allocs["req-two"]["status"] == "reserved" and len(allocs["req-two"]["claims"]) == 2
    assert allocs["req-two"]["vm_profile"] == "h200_2g_48c_128g"
    capsys.readouterr()
    assert cli.main(["status", "--db-url", db_url]) == 0
    out = capsys.readouterr().out
    assert "1g:13 2g:6 4g:3 8g:1" in out and "8 GPU: 5 usable GPU(s) stranded by topology" in out
    assert cli.main(["status", "--db-url", db_url, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["revision"] == doc["revision"]


def test_status_without_a_schema_is_an_error(empty_db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "--db-url", empty_db_url]) == 1
    assert "status.no_schema" in capsys.readouterr().err
