"""The JSON API's contract on the applied example fleet: the same facts as the CLI and the database."""

from __future__ import annotations

import json
import re

import psycopg
import pytest
import yaml

from reconciler import cli
from reconciler.service import api, pool
from reconciler.store import connections
from schemas import output
from tests.service.conftest import BROKEN_NODE, DRIFT_NODE, DRIFT_SLOT, EXAMPLE, HTML_MESSAGE, HTML_NODE, Served


def _status_doc(url: str, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    assert cli.main(["status", "-o", "json", "--db-url", url]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_allocations_list_and_filters_match_the_status_command(
    served: Served, fleet_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = _status_doc(fleet_url, capsys)
    everything = served.json("/api/v1/allocations")
    assert everything["total"] == len(everything["items"]) >= len(status["allocations"])
    by_id = {a["id"]: a for a in everything["items"]}
    for a in status["allocations"]:  # the live ones: same state, node, slots, profile and reason
        mine = by_id[a["id"]]
        assert (mine["state"], mine["node"], mine["slot_indexes"], mine["vm_profile"], mine["tenant"]) == (
            a["status"],
            a["node"],
            a["slot_indexes"],
            a["vm_profile"],
            a["tenant"],
        )
        expected = None if a["pending"] is None else {**a["pending"], "since": mine["pending"]["since"]}
        assert mine["pending"] == expected
    pending = served.json("/api/v1/allocations?state=pending")["items"]
    assert {a["id"] for a in pending} == {a["id"] for a in status["allocations"] if a["status"] == "pending"}
    assert pending and all(a["pending"]["code"].startswith("plan.") for a in pending)
    tenant = status["allocations"][0]["tenant"]
    assert {a["id"] for a in served.json(f"/api/v1/allocations?tenant={tenant}")["items"]} == {
        a["id"] for a in everything["items"] if a["tenant"] == tenant
    }
    on_node = served.json(f"/api/v1/allocations?node={DRIFT_NODE}")["items"]
    assert on_node and {a["id"] for a in on_node} == {a["id"] for a in status["allocations"] if a["node"] == DRIFT_NODE}
    page = served.json("/api/v1/allocations?limit=2&offset=1")
    assert page["total"] == everything["total"] and [a["id"] for a in page["items"]] == [
        a["id"] for a in everything["items"][1:3]
    ]
    # The total is every match whichever page is asked for: a first page that holds them all, a full one,
    # one past the end, and with each filter (the node's needs the join the count otherwise leaves out).
    for query, matches in (
        ("", everything["items"]),
        (f"&node={DRIFT_NODE}", on_node),
        (f"&tenant={tenant}", [a for a in everything["items"] if a["tenant"] == tenant]),
        ("&state=pending", pending),
    ):
        for limit, offset in ((len(matches) + 1, 0), (1, 0), (1, len(matches) - 1), (5, len(matches) + 3)):
            got = served.json(f"/api/v1/allocations?limit={limit}&offset={offset}{query}")
            assert got["total"] == len(matches), (query, limit, offset)
            assert [a["id"] for a in got["items"]] == [a["id"] for a in matches[offset : offset + limit]]


def test_allocation_detail_has_placement_boot_slot_host_phase_and_times(served: Served, fleet_url: str) -> None:
    a = served.json("/api/v1/allocations/alloc-0001")
    assert (a["state"], a["node"], a["region"], a["gpu_count"]) == ("reserved", DRIFT_NODE, "us-east-1", 1)
    assert a["sku"] == "h200-sxm-slice" and a["vm_profile"] and a["pending"] is None
    slots = yaml.safe_load((EXAMPLE / "slotmaps" / f"{DRIFT_NODE}.yaml").read_text())["slots"]
    boot = next(s for s in slots if s["slot_index"] == min(a["slot_indexes"]))
    assert a["boot_slot"] == {
        "slot_index": boot["slot_index"],
        "mac_address": boot["mac_address"],
        "private_ip": boot["private_ip"],
    }
    assert a["host"]["vm_state"] == "provisioning" and a["host"]["phase"] == "image"
    assert a["requested_at"].startswith("2026-11-20T09:00:00") and a["placed_at"] and a["active_at"] is None
    assert [(c["node"], c["slot_index"], c["status"]) for c in a["claims"]] == [
        (DRIFT_NODE, i, "reserved") for i in a["slot_indexes"]
    ]
    multi = served.json("/api/v1/allocations/alloc-0003")  # 4 GPUs: the boot slot is the lowest index
    assert multi["boot_slot"]["slot_index"] == min(multi["slot_indexes"]) and len(multi["slot_indexes"]) == 4
    waiting = served.json("/api/v1/allocations/alloc-0007")
    assert waiting["state"] == "pending" and waiting["pending"]["code"].startswith("plan.sku_unavailable")
    assert waiting["pending"]["message"] and waiting["boot_slot"] is None and waiting["node"] is None


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/api/v1/allocations/no-such-allocation", 404, api.NOT_FOUND),
        ("/api/v1/nodes/no-such-node", 404, api.NOT_FOUND),
        ("/api/v1/no-such-thing", 404, api.ROUTE_NOT_FOUND),
        ("/api/v1/allocations?state=sleeping", 400, api.BAD_REQUEST),
        ("/api/v1/allocations?limit=0", 400, api.BAD_REQUEST),
        ("/api/v1/nodes?state=purple", 400, api.BAD_REQUEST),
        ("/api/v1/usage?from=yesterday", 400, api.BAD_REQUEST),
        ("/api/v1/usage?from=2026-11-02&to=2026-11-01", 400, api.BAD_REQUEST),
    ],
)
def test_errors_are_json_with_stable_codes(served: Served, path: str, status: int, code: str) -> None:
    got, headers, body = served.get(path)
    assert got == status and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert set(doc) == {"error"} and doc["error"]["code"] == code and doc["error"]["message"]


def test_the_server_takes_no_writes(served: Served, fleet_url: str) -> None:
    got, headers, body = served.get("/api/v1/allocations", method="POST")
    assert got == 405 and json.loads(body)["error"]["code"] == api.METHOD_NOT_ALLOWED and "GET" in headers["Allow"]
    readers = pool.Pool(fleet_url, size=1)
    try:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction), readers.reading() as conn:
            conn.execute("UPDATE allocations SET tenant = 'mallory'")
    finally:
        readers.close()


def test_capacity_is_the_status_commands(served: Served, fleet_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = _status_doc(fleet_url, capsys)
    doc = served.json("/api/v1/capacity")
    assert doc["capacity"] == json.loads(json.dumps(status["capacity"])) and doc["capacity"]
    assert doc["revision"] == status["revision"] and doc["stale"] is False
    one = served.json("/api/v1/capacity?region=us-east-1&sku=h200-sxm-slice")["capacity"]
    assert [(o["region"], o["sku"]) for o in one] == [("us-east-1", "h200-sxm-slice")]


def test_the_service_holds_the_status_commands_whole_document(
    served: Served, fleet_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One builder: the document the service serves from (capacity, dashboard, gauges) is `status -o json`'s."""
    status = _status_doc(fleet_url, capsys)
    answer = served.httpd.service.capacity.get()
    assert answer.stale is False
    held = json.loads(output.dumps(answer.computed.doc, "json"))
    assert held == status
    assert "orphaned" in held and all("lifecycle" in a and "orphaned" in a for a in held["allocations"])
    assert any(a["lifecycle"] for a in held["allocations"])


def test_capacity_follows_a_change_in_the_store(served: Served, fleet_url: str) -> None:
    before = served.json("/api/v1/capacity?region=us-east-1&sku=h200-sxm-slice")["capacity"][0]
    with connections.connect(fleet_url, autocommit=True) as conn:  # a host reports its node unhealthy
        conn.execute("UPDATE host_status SET healthy = false WHERE node_name = 'h200-use1-s02'")
    after = served.json("/api/v1/capacity?region=us-east-1&sku=h200-sxm-slice")["capacity"][0]
    assert after["not_launchable"].get("unhealthy", 0) > before["not_launchable"].get("unhealthy", 0)
    assert after["usable"] < before["usable"]


def test_nodes_show_slot_states_claims_and_drift(served: Served, fleet_url: str) -> None:
    with connections.connect(fleet_url, autocommit=True) as conn:
        truth = {
            (str(n), int(i)): str(s)
            for n, i, s in conn.execute(
                "SELECT n.name, s.slot_index, s.status FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
                " WHERE s.present AND n.present"
            ).fetchall()
        }
        names = [str(r[0]) for r in conn.execute("SELECT name FROM nodes WHERE present ORDER BY name").fetchall()]
    listing = served.json("/api/v1/nodes")
    assert [n["name"] for n in listing["items"]] == names and listing["total"] == len(names)
    for n in listing["items"]:
        for s in n["slots"]:
            assert s["status"] == truth[(n["name"], s["slot_index"])]
            if (n["name"], s["slot_index"]) == (DRIFT_NODE, DRIFT_SLOT):
                assert s["state"] == "drift"
            elif s["status"] != "available":
                assert s["state"] == {"cleanup_blocked": "blocked"}.get(s["status"], s["status"])
    drifted = served.json("/api/v1/nodes?state=drift")["items"]
    assert [n["name"] for n in drifted] == [DRIFT_NODE]
    node = served.json(f"/api/v1/nodes/{DRIFT_NODE}")
    assert node["host"]["healthy"] is True and node["host"]["drift_valid"] is True
    assert (node["host"]["agent_version"], node["host"]["bootstrap_state"], node["host"]["reboot_required"]) == (
        "0.1.0",
        "reboot_required",
        True,
    )
    assert node["host"]["firmware"] == {"ready": None, "code": "host.firmware.no_evidence", "evidence": {}}
    by_index = {s["slot_index"]: s for s in node["slots"]}
    assert by_index[DRIFT_SLOT]["state"] == "drift" and by_index[DRIFT_SLOT]["status"] == "available"
    assert by_index[DRIFT_SLOT]["drift"][0]["code"] == "drift.disk.signature_present"
    assert by_index[0]["claim"] == {"allocation_id": "alloc-0001", "status": "reserved", "tenant": "acme-research"}
    assert by_index[0]["host"]["vm_state"] == "provisioning"
    assert "alloc-0001" in {a["id"] for a in node["allocations"]}
    broken = served.json(f"/api/v1/nodes/{BROKEN_NODE}")  # a malformed report: flagged, nothing breaks
    assert broken["host"]["drift_valid"] is False and broken["drift"] == []
    assert broken["host"]["agent_version"] is None and broken["host"]["reboot_required"] is None
    assert all(s["state"] != "drift" for s in broken["slots"])


def test_drift_lists_findings_and_invalid_reports(served: Served) -> None:
    doc = served.json("/api/v1/drift")
    assert doc["nodes_reporting"] == 3 and sorted(doc["invalid_reports"]) == sorted([BROKEN_NODE, HTML_NODE])
    assert {(f["node"], f["slot_index"], f["code"]) for f in doc["findings"]} == {
        (DRIFT_NODE, DRIFT_SLOT, "drift.disk.signature_present"),
        (HTML_NODE, None, "drift.network.problem"),
    }
    assert next(f for f in doc["findings"] if f["node"] == HTML_NODE)["message"] == HTML_MESSAGE
    assert served.json(f"/api/v1/drift?node={DRIFT_NODE}")["total"] == 1


def test_history_is_the_history_commands(served: Served, fleet_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert cli.main(["history", "-o", "json", "--db-url", fleet_url]) == 0
    cli_rows = json.loads(capsys.readouterr().out)
    mine = served.json("/api/v1/history")["items"]
    assert [(r["id"], r["revision"], r["result"], r["counts"]) for r in mine] == [
        (r["id"], r["revision"], r["result"], r["counts"]) for r in cli_rows
    ]
    assert mine[0]["result"] == "changed" and mine[0]["counts"]["placed"] >= 1


def test_openapi_documents_every_route(served: Served) -> None:
    doc = served.json("/api/v1/openapi.json")
    assert doc["openapi"].startswith("3.")
    documented = {api.PREFIX + p for p in doc["paths"]}
    assert served.json("/api/v1")["endpoints"] == sorted(documented)
    for pattern, _ in api.ROUTES:
        sample = pattern.pattern.strip("^$").replace("/?", "").replace(api._ID, "{x}")
        if sample != api.PREFIX:
            # every path parameter, wherever it sits ("/allocations/{id}/telemetry"), reads as {x}
            assert any(re.sub(r"\{[^}]+\}", "{x}", d) == sample for d in documented), sample
    assert set(doc["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"]) >= set(api.CODES)
