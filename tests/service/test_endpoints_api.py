"""The tenant's way in, shown: SSH endpoint in the API allocation detail, the dashboard, `status` and /metrics.

The served example fleet places alloc-0001 (extra_ports [8888]) on a node whose
ingress is 203.0.113.x:20000-20999 (examples/fleet/nodes).
"""

from __future__ import annotations

from reconciler.commands import status
from tests.service.conftest import Served
from tests.service.test_metrics_usage import _samples

ALLOC = "alloc-0001"


def test_the_allocation_detail_names_its_ssh_endpoint(served: Served) -> None:
    a = served.json(f"/api/v1/allocations/{ALLOC}")
    ssh, extra = a["endpoints"]
    assert ssh["purpose"] == "ssh" and ssh["guest_port"] == 22 and ssh["private_ip"] == a["boot_slot"]["private_ip"]
    assert a["ssh"] == {"address": ssh["public_address"], "port": ssh["public_port"]}
    assert ssh["public_address"].startswith("203.0.113.") and 20000 <= ssh["public_port"] <= 20999
    assert (extra["purpose"], extra["guest_port"]) == ("extra", 8888) and extra["public_port"] != ssh["public_port"]
    assert served.json("/api/v1/allocations/alloc-0007")["endpoints"] == []  # pending: no endpoint


def test_the_dashboard_status_and_metrics_show_it(served: Served, fleet_url: str) -> None:
    a = served.json(f"/api/v1/allocations/{ALLOC}")
    ssh = a["endpoints"][0]
    code, _, body = served.get(f"/allocations/{ALLOC}")
    assert code == 200 and f"{ssh['public_address']}:{ssh['public_port']}" in body.decode()
    doc = status.collect(fleet_url)
    mine = next(x for x in doc["allocations"] if x["id"] == ALLOC)
    assert mine["endpoints"] == a["endpoints"]
    assert f"ssh {ssh['public_address']}:{ssh['public_port']} -> {ssh['private_ip']}:22" in status.render_text(doc)
    code, _, metrics = served.get("/metrics")
    samples = _samples(metrics.decode())
    node = (("node", a["node"]),)
    on_node = sum(len(x["endpoints"]) for x in doc["allocations"] if x["node"] == a["node"])
    assert samples["gpuaas_ingress_ports_used"][node] == on_node >= 2
    assert samples["gpuaas_ingress_ports"][node] == 1000
