"""The host plan's shutdown timeout is `shutdown_timeout_s` in code and `graceful_timeout_s` on the wire.

The JSON key kept its first name so plans already stored in `host_plans`, and
host agents not yet upgraded, read the same bytes: renaming it would change
every plan's bytes and make an older agent refuse the new key.
"""

from __future__ import annotations

import json

from schemas import hostplans

PLAN = hostplans.HostPlan(
    node="n1",
    generation=3,
    network=hostplans.Network("10.0.0.0/24", "10.0.0.1", "10.0.0.10", "10.0.0.99", "br0"),
    os_disk="/dev/disk/by-id/nvme-os",
    shutdown_timeout_s=42,
    readiness_timeout_s=300,
)


def test_the_wire_keeps_the_first_name() -> None:
    doc = hostplans.to_json(PLAN)
    assert doc["graceful_timeout_s"] == 42 and "shutdown_timeout_s" not in doc
    assert hostplans.from_json(json.loads(json.dumps(doc))) == PLAN


def test_a_plan_written_before_the_rename_reads_back() -> None:
    before = {
        "node": "n1",
        "generation": 3,
        "network": {
            "subnet": "10.0.0.0/24",
            "gateway": "10.0.0.1",
            "dhcp_start": "10.0.0.10",
            "dhcp_end": "10.0.0.99",
            "bridge": "br0",
        },
        "os_disk": "/dev/disk/by-id/nvme-os",
        "graceful_timeout_s": 42,
        "readiness_timeout_s": 300,
        "vms": [],
        "releases": [],
        "slots": [],
        "pinned_images": [],
    }
    plan = hostplans.from_json(before)
    assert plan.shutdown_timeout_s == 42 and plan == PLAN
