"""The host plan's JSON (schemas.hostplans.to_json) is exactly what `dataclasses.asdict` made before.

to_json is built field by field for speed; a plan's stored bytes must not
move (a changed document would bump every host's generation on upgrade).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from schemas import hostplans as hp


def _reference(plan: hp.HostPlan) -> dict[str, Any]:
    """The codec as it was: asdict under the wire names, then the optional fields dropped while empty."""
    doc = {hp.WIRE_NAMES.get(k, k): v for k, v in dataclasses.asdict(plan).items()}
    for vm in (*doc["vms"], *doc["releases"]):
        if vm["readiness_timeout_s"] is None:
            del vm["readiness_timeout_s"]
    doc.pop("disk_identities")
    if not plan.ingress:
        doc.pop("ingress")
    if plan.disk_identities:
        doc["disk_identities"] = [
            {"slot_index": i.slot_index, "nvme_identity": i.nvme_identity.as_dict()} for i in plan.disk_identities
        ]
    return doc


def _plan(**changes: Any) -> hp.HostPlan:
    b0 = hp.SlotBundle(
        0, "0000:1b:00.0", "0000:1a:00.1", "/dev/disk/by-id/nvme-S0", "52:54:00:00:00:01", "10.0.0.10", 0
    )
    b1 = hp.SlotBundle(1, "0000:1c:00.0", None, "/dev/disk/by-id/nvme-S1", "52:54:00:00:00:02", "10.0.0.11", 1)
    image = hp.ImageRef("ubuntu", "s3://img/ubuntu.qcow2", "ab" * 32, "qcow2", "ubuntu")
    vm = hp.VmSpec("a-1", "acme", (b0, b1), 8, 4096, True, "1G", image, ("ssh-ed25519 AAAA k",), ("c-1", "c-2"), 45)
    bare = hp.VmSpec("a-2", "acme", (b1,), 2, 1024)
    base = hp.HostPlan(
        "node-a",
        3,
        hp.Network("10.0.0.0/24", "10.0.0.1", "10.0.0.100", "10.0.0.200", "br0"),
        "/dev/disk/by-id/nvme-OS",
        vms=(vm,),
        releases=(bare,),
        slots=(b0, b1),
        disk_identities=(hp.SlotIdentity(0, hp.DiskIdentity(1 << 40, model="m", serial="s")),),
        pinned_images=("cd" * 32,),
        ingress=(hp.IngressRule("a-1", "198.51.100.7", 30022, "10.0.0.10"),),
    )
    return dataclasses.replace(base, **changes)


def test_to_json_is_the_asdict_document_key_for_key_and_in_order() -> None:
    for plan in (_plan(), _plan(ingress=(), disk_identities=(), vms=(), releases=()), _plan(pinned_images=())):
        doc = hp.to_json(plan)
        assert doc == _reference(plan)
        assert json.dumps(doc) == json.dumps(_reference(plan))  # same key order: same bytes
        assert hp.from_json(json.loads(json.dumps(doc))) == plan
