"""Write one host plan per node (host_plans), with a generation.

The plan of a node is derived from the store alone, never from git directly:

- vms: the node's live slot claims (reserved, provisioning, active) grouped by
  allocation, each built from the claims' immutable snapshots (bundle, VM
  profile, image ref and digest, SSH keys), so a later SKU or slot-map edit
  changes no running VM;
- releases: allocations whose claims on the node are releasing;
- slots: every approved slot the node still declares, free ones too;
- ingress: the live public endpoints (allocation_endpoints) of the VMs in
  `vms`, which the host realises as DNAT rules; a release carries none (the
  host removes every rule of a releasing allocation before its wipe);
- disk_identities: the approved disk identity of the slots whose slot map
  records one (`nvme_identity`), which the host's disk guard compares with
  the block device before every write, wipe and verify.

The generation goes up only when the spec changes, so re-applying a revision
leaves every plan (and every host) alone. Writers of one node are
serialised by an advisory lock and read the claims after taking it, so a
plan can never be overwritten by one built from older claims.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from reconciler.store import endpoints
from reconciler.store.connections import Connection
from schemas import dberrors, progress, snapshots
from schemas import hostplans as codec
from schemas.errors import PermanentError


@dataclass(frozen=True, slots=True)
class Written:
    node: str
    generation: int
    changed: bool


def _bundle(slot: Mapping[str, Any]) -> codec.SlotBundle:
    return codec.SlotBundle(
        slot_index=int(slot["slot_index"]),
        gpu_pci_address=str(slot["gpu_pci_address"]),
        fabric_vf_pci_address=slot.get("fabric_vf_pci_address"),
        nvme_device=str(slot["nvme_device"]),
        mac_address=str(slot["mac_address"]),
        private_ip=str(slot["private_ip"]),
        numa_node=int(slot["numa_node"]),
    )


def _vm(allocation_id: str, claims: list[tuple[str, Mapping[str, Any]]]) -> codec.VmSpec:
    claims = sorted(claims, key=lambda c: int(c[1]["slot"]["slot_index"]))
    snap = claims[0][1]
    where = f"snapshot of claim {claims[0][0]} ({allocation_id})"
    profile = snapshots.profile_from_json(snap.get("profile"), where=where)
    if profile is None:
        raise PermanentError(f"{where}: a slice VM's claim records no profile", code=snapshots.NO_PROFILE)
    image = snap.get("image")
    return codec.VmSpec(
        allocation_id=allocation_id,
        tenant=str(snap.get("tenant", "")),
        bundles=tuple(_bundle(s["slot"]) for _, s in claims),
        vcpu_count=profile.vcpu_count,
        memory_mib=profile.memory_mib,
        hugepages=profile.hugepages_enabled,
        hugepage_size=profile.hugepage_size,
        image=codec.ImageRef(
            slug=str(image["slug"]),
            source_ref=str(image["source_ref"]),
            digest_sha256=image.get("digest_sha256"),
            image_format=str(image["image_format"]),
            default_username=str(image.get("default_username") or "ubuntu"),
        )
        if image
        else None,
        ssh_keys=tuple(snap.get("ssh_keys") or ()),
        claim_ids=tuple(cid for cid, _ in claims),
        readiness_timeout_s=profile.readiness_timeout_s,
    )


def build(conn: Connection, node: str, generation: int = 0) -> codec.HostPlan | None:
    """The plan `node` should run now (None when the node is unknown)."""
    row = conn.execute(
        "SELECT n.id, n.os_disk, n.management_network, f.graceful_shutdown_timeout_s, f.readiness_timeout_s"
        " FROM nodes n LEFT JOIN fleet_settings f ON true WHERE n.name = %s",
        (node,),
    ).fetchone()
    if row is None:
        return None
    node_id, os_disk, net, graceful, readiness = row
    claims = conn.execute(
        "SELECT id, allocation_id, status, resource_snapshot FROM allocation_resource_claims"
        " WHERE node_id = %s AND claim_kind = 'slot'"
        " AND status IN ('reserved', 'provisioning', 'active', 'releasing')"
        " ORDER BY allocation_id, slot_index",
        (node_id,),
    ).fetchall()
    running: dict[str, list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
    releasing: dict[str, list[tuple[str, Mapping[str, Any]]]] = defaultdict(list)
    for cid, alloc, status, snap in claims:
        (releasing if status == "releasing" else running)[str(alloc)].append((str(cid), snap))
    slots = conn.execute(
        "SELECT slot_index, gpu_pci_address, fabric_vf_pci_address, nvme_device, mac_address,"
        " host(private_ip) AS private_ip, numa_node, nvme_identity FROM node_resource_slots"
        " WHERE node_id = %s AND present AND approved ORDER BY slot_index",
        (node_id,),
    ).fetchall()
    dhcp = net.get("dhcp_range", {})
    return codec.HostPlan(
        pinned_images=pinned_images(conn),
        node=node,
        generation=generation,
        network=codec.Network(
            subnet=str(net["subnet"]),
            gateway=str(net["gateway"]),
            dhcp_start=str(dhcp.get("start", "")),
            dhcp_end=str(dhcp.get("end", "")),
            bridge=str(net.get("bridge", "gpuaasbr0")),
        ),
        os_disk=str(os_disk),
        shutdown_timeout_s=int(graceful or 120),
        readiness_timeout_s=int(readiness or 300),
        vms=tuple(_vm(a, c) for a, c in sorted(running.items())),
        releases=tuple(_vm(a, c) for a, c in sorted(releasing.items())),
        slots=tuple(
            codec.SlotBundle(
                slot_index=int(i),
                gpu_pci_address=str(g),
                fabric_vf_pci_address=vf,
                nvme_device=str(d),
                mac_address=str(mac),
                private_ip=str(ip),
                numa_node=int(numa),
            )
            for i, g, vf, d, mac, ip, numa, _ in slots
        ),
        disk_identities=tuple(
            codec.SlotIdentity(int(row[0]), identity)
            for row in slots
            if (identity := codec.DiskIdentity.from_dict(row[7])) is not None
        ),
        ingress=endpoints.rules_for(conn, node_id, running),
    )


def _without_generation(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k != "generation"}


def pinned_images(conn: Connection) -> tuple[str, ...]:
    """Digests of the images the catalog pins in every host's cache (`Image.cache_pinned`)."""
    rows = conn.execute(
        "SELECT digest_sha256 FROM os_images WHERE present AND cache_pinned AND digest_sha256 IS NOT NULL ORDER BY 1"
    ).fetchall()
    return tuple(str(r[0]) for r in rows)


def write_one(conn: Connection, node: str, *, revision: str | None = None) -> Written | None:
    """Rebuild one node's plan; bump the generation only if the spec changed."""
    with dberrors.wrapped(f"write host plan of {node}"), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('gpuaas.host_plan'), hashtext(%s))", (node,))
        have = conn.execute("SELECT generation, spec FROM host_plans WHERE node_name = %s", (node,)).fetchone()
        plan = build(conn, node)
        if plan is None:
            return None
        current = int(have[0]) if have else 0
        spec = codec.to_json(plan)
        if have is not None and _without_generation(have[1]) == _without_generation(_json_round_trip(spec)):
            return Written(node, current, changed=False)
        plan = dataclasses.replace(plan, generation=current + 1)
        conn.execute(
            "INSERT INTO host_plans (node_name, generation, spec, revision) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (node_name) DO UPDATE SET generation = EXCLUDED.generation, spec = EXCLUDED.spec,"
            " revision = EXCLUDED.revision, updated_at = now()",
            (node, plan.generation, Jsonb(codec.to_json(plan)), revision),
        )
        return Written(node, plan.generation, changed=True)


def write(
    conn: Connection,
    nodes: Iterable[str] | None = None,
    *,
    revision: str | None = None,
    shown: progress.Phase | None = None,
) -> list[Written]:
    """Rebuild the plans of `nodes` (default: every present node and every node holding claims).

    `shown` (a progress phase) gets the node count and advances per node.
    """
    if nodes is None:
        with dberrors.wrapped("list nodes for host plans"):
            rows = conn.execute(
                "SELECT name FROM nodes n WHERE present OR EXISTS (SELECT 1 FROM allocation_resource_claims c"
                " WHERE c.node_id = n.id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'))"
                " ORDER BY name"
            ).fetchall()
        nodes = [str(r[0]) for r in rows]
    out = []
    todo = sorted(set(nodes))
    if shown is not None:
        shown.total = len(todo)
    for node in todo:
        written = write_one(conn, node, revision=revision)
        if written is not None:
            out.append(written)
        if shown is not None:
            shown.advance()
    return out


def read(conn: Connection, node: str) -> codec.HostPlan | None:
    """The stored plan of a node, decoded (what a host reconciler reads)."""
    with dberrors.wrapped(f"read host plan of {node}"):
        row = conn.execute("SELECT spec FROM host_plans WHERE node_name = %s", (node,)).fetchone()
    return codec.from_json(row[0]) if row else None


def _json_round_trip(spec: dict[str, Any]) -> Any:
    import json

    return json.loads(json.dumps(spec))
