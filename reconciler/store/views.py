"""Read models for `gpuaas status` and `gpuaas plan`: the desired state the store holds, allocations with claims.

`desired_state(conn)` rebuilds a DesiredState from the inventory rows the
last sync wrote (present rows only), so status needs no git checkout and
shows exactly what the database reconciles against. It is the inverse of
the rows (store/inventoryrows.py, store/lifecycle.sync_settings): every
field of every kind comes back as git declared it (tests/claims/test_roundtrip.py).
A node's management network is stored resolved; it is dropped again when it
equals the fleet's. A Fleet row synced before its regions were stored
(migration 0082) derives them from the nodes until the next sync.

Nothing here writes.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from psycopg.abc import Buffer, Loader
from psycopg.rows import dict_row
from psycopg.types.json import JsonbLoader, JsonLoader
from pydantic import ValidationError

from desired import models as m
from desired.state import DesiredState
from reconciler import codes as reconciler_codes
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.errors import PermanentError

_DOC = {"apiVersion": m.API_VERSION}


@dataclass(frozen=True, slots=True)
class ClaimView:
    node: str
    slot_index: int | None
    kind: str
    status: str


@dataclass(frozen=True, slots=True)
class AllocationView:
    id: str
    tenant: str
    sku: str
    gpu_count: int
    region: str
    desired_state: str
    status: str
    node: str | None
    slot_indexes: tuple[int, ...]
    vm_profile: str | None
    pending_code: str | None
    pending_message: str | None
    claims: tuple[ClaimView, ...]
    placed_at: dt.datetime | None
    active_at: dt.datetime | None


def _rows(conn: Connection, query: str, *, memo_json: bool = False) -> list[dict[str, Any]]:
    cur = conn.cursor(row_factory=dict_row)
    if memo_json:
        # 80,000 slot rows repeat a handful of JSON values (capacity metadata, blockers):
        # each distinct text is parsed once. The values are only read (validated into models).
        for name in ("json", "jsonb"):
            cur.adapters.register_loader(name, _memo_loader(name))
    return cur.execute(query).fetchall()


def _memo_loader(name: str) -> type[Loader]:
    base: type[Loader] = JsonLoader if name == "json" else JsonbLoader
    seen: dict[bytes, Any] = {}

    class Memo(base):  # type: ignore[valid-type,misc]
        def load(self, data: Buffer) -> Any:
            key = bytes(data)
            value = seen.get(key, _MISSING)
            if value is _MISSING:
                value = seen[key] = json.loads(key.decode())
            return value

    return Memo


_MISSING = object()

# Only the columns the models are rebuilt from: `*` also parsed health, quarantine and
# placement JSON of every row.
_NODES_SQL = (
    "SELECT name, region, pool, hardware_tags, profile_tags, baremetal_sku, admin_state, storage_mode, os_disk, org,"
    " firmware_version, firmware_ready, management_network, public_addresses, ingress, machine"
    " FROM nodes WHERE present ORDER BY name"
)
_ALLOCATIONS_SQL = (
    "SELECT id, tenant, sku, gpu_count, region, image, ssh_keys, vm_profile, desired_state, requested_at, lease_hours,"
    " extra_ports FROM allocations WHERE present ORDER BY id"
)


def current_revision(conn: Connection) -> str | None:
    """The revision the inventory was last synced from (the newest successful reconciliation)."""
    with dberrors.wrapped("read the current revision"):
        row = conn.execute(
            "SELECT revision FROM reconciliations WHERE result IN ('changed', 'unchanged')"
            " AND revision IS NOT NULL ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            row = conn.execute("SELECT revision FROM desired_revisions ORDER BY recorded_at DESC LIMIT 1").fetchone()
    return str(row[0]) if row else None


def desired_state(conn: Connection) -> DesiredState:
    with dberrors.wrapped("read the stored inventory"):
        fleet = _rows(conn, "SELECT * FROM fleet_settings")
        skus = _rows(conn, "SELECT * FROM sku_catalog WHERE present ORDER BY sku")
        images = _rows(conn, "SELECT * FROM os_images WHERE present ORDER BY slug")
        nodes = _rows(conn, _NODES_SQL, memo_json=True)
        slots = _rows(conn, _SLOTS_SQL, memo_json=True)
        allocations = _rows(conn, _ALLOCATIONS_SQL)
    state = DesiredState(revision=current_revision(conn))
    try:
        network = fleet[0]["management_network"] if fleet else None
        if fleet:
            state.fleet = m.Fleet.model_validate(_fleet(fleet[0], nodes))
        state.skus = {r["sku"]: m.Sku.model_validate(_sku(r)) for r in skus}
        state.images = {r["slug"]: m.Image.model_validate(_image(r)) for r in images}
        state.nodes = {r["name"]: m.Node.model_validate(_node(r, network)) for r in nodes}
        by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in slots:
            by_node[r["node"]].append(r)
        state.slot_maps = {name: m.SlotMap.model_validate(_slot_map(name, rows)) for name, rows in by_node.items()}
        state.allocations = {r["id"]: m.Allocation.model_validate(_allocation(r)) for r in allocations}
    except ValidationError as e:
        raise PermanentError(
            f"the stored inventory does not read back as desired state: {e}",
            code=reconciler_codes.DB_INVENTORY_UNREADABLE,
        ) from e
    return state


def _fleet(r: dict[str, Any], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    regions: dict[str, set[str]] = defaultdict(set)
    for n in nodes:
        regions[n["region"]].add(n["pool"])
    derived = [
        {"name": reg, "pools": [{"name": p} for p in sorted(pools)]} for reg, pools in sorted(regions.items())
    ] or [{"name": "none", "pools": [{"name": "none"}]}]
    return {
        **_DOC,
        "kind": "Fleet",
        "name": r["name"],
        "management_network": r["management_network"],
        "placement": r["placement"],
        "graceful_shutdown_timeout_s": r["graceful_shutdown_timeout_s"],
        "readiness_timeout_seconds": r["readiness_timeout_s"],
        "host_liveness_ttl_seconds": r["host_liveness_ttl_s"],
        "max_provision_attempts": r["max_provision_attempts"],
        "regions": r["regions"] if r["regions"] is not None else derived,
        **({"ingress": r["ingress"]} if r["ingress"] is not None else {}),
        **({"machine_providers": r["machine_providers"]} if r["machine_providers"] is not None else {}),
    }


def _sku(r: dict[str, Any]) -> dict[str, Any]:
    baremetal = r["capacity_shape"] == m.CapacityShape.BAREMETAL.value
    return {
        **_DOC,
        "kind": "Sku",
        "sku": r["sku"],
        "display_name": r["display_name"],
        "capacity_shape": r["capacity_shape"],
        "accelerator_vendor": r["accelerator_vendor"],
        "accelerator_model": r["accelerator_model"],
        "allowed_gpu_counts": None if baremetal else list(r["allowed_gpu_counts"]),
        "gpu_count": r["gpu_count"] if baremetal else None,
        "exclusive_node": r["exclusive_node"],
        "network_fabric": r["network_fabric"],
        "topology_policy": r["topology_policy"],
        "resource_profile": r["resource_profile"],
        "gpu_hourly_price_minor": r["gpu_hourly_price_minor"],
        "currency": r["currency"],
        "active": r["active"],
        "same_node_required": r["same_node_required"],
        "readiness_timeout_seconds": r["readiness_timeout_seconds"],
    }


_IMAGE_FIELDS = (
    "slug",
    "display_name",
    "version",
    "target",
    "family",
    "architecture",
    "accelerator_vendor",
    "accelerator_model",
    "network_fabric",
    "image_format",
    "source_type",
    "source_ref",
    "digest_sha256",
    "size_bytes",
    "cloud_init_supported",
    "guest_agent_supported",
    "default_username",
    "driver_strategy",
    "compatible_skus",
    "active",
    "inactive_since",
    "cache_pinned",
)


def _image(r: dict[str, Any]) -> dict[str, Any]:
    return {**_DOC, "kind": "Image", **{k: r[k] for k in _IMAGE_FIELDS}}


def _node(r: dict[str, Any], fleet_network: Any) -> dict[str, Any]:
    firmware = None
    if r["firmware_version"] is not None:
        firmware = {"version": r["firmware_version"], "ready": r["firmware_ready"]}
    network = r["management_network"]
    return {
        **_DOC,
        "kind": "Node",
        "name": r["name"],
        "region": r["region"],
        "pool": r["pool"],
        "hardware_tags": list(r["hardware_tags"]),
        "profile_tags": list(r["profile_tags"]),
        "baremetal_sku": r["baremetal_sku"],
        "admin_state": r["admin_state"],
        "storage_mode": r["storage_mode"],
        "os_disk": r["os_disk"],
        "org": r["org"],
        "firmware_profile": firmware,
        "management_network": None if network == fleet_network else network,
        **({"public_addresses": list(r["public_addresses"])} if r.get("public_addresses") else {}),
        **({"ingress": r["ingress"]} if r.get("ingress") else {}),
        "machine": r["machine"],
    }


_SLOT_FIELDS = (
    "slot_index",
    "gpu_pci_address",
    "gpu_model",
    "gpu_uuid",
    "numa_node",
    "slot_group",
    "pcie_pair",
    "nvme_device",
    "network_fabric",
    "fabric_vf_pci_address",
    "fabric_parent_device",
    "fabric_claim_mode",
    "mac_address",
    "vcpu_count",
    "memory_mib",
    "sharing_model",
    "max_claims",
    "parent_slot_id",
    "compute_milli",
    "capacity_metadata",
    "blockers",
    "enabled",
)
# private_ip as PostgreSQL prints it (no prefix on a single address): the inet loader built an
# ipaddress object per slot only for it to be printed again.
_SLOTS_SQL = (
    "SELECT n.name AS node, "  # noqa: S608 - built from the constant field names above, no input
    + ", ".join(f"s.{k}" for k in _SLOT_FIELDS)
    + ", CASE WHEN masklen(s.private_ip) = CASE family(s.private_ip) WHEN 4 THEN 32 ELSE 128 END"
    " THEN host(s.private_ip) ELSE s.private_ip::text END AS private_ip, s.nvme_identity, s.approved"
    " FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
    " WHERE s.present AND n.present ORDER BY n.name, s.slot_index"
)


def _slot_map(node: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    slots = [
        {
            **{k: r[k] for k in _SLOT_FIELDS},
            "private_ip": _ip_text(r["private_ip"]),
            **({"nvme_identity": r["nvme_identity"]} if r.get("nvme_identity") else {}),
        }
        for r in rows
    ]
    return {
        **_DOC,
        "kind": "SlotMap",
        "node": node,
        "approval_required": not all(r["approved"] for r in rows),
        "slots": slots,
    }


def _ip_text(text: str) -> str:
    """The inet as psycopg's loader printed it: an address, or (with a prefix) an interface."""
    if "/" in text:
        return str(ipaddress.ip_interface(text))
    return text if _IPV4_HOST.match(text) else str(ipaddress.ip_address(text))


_IPV4_HOST = re.compile(r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$")


def _allocation(r: dict[str, Any]) -> dict[str, Any]:
    return {
        **_DOC,
        "kind": "Allocation",
        "id": r["id"],
        "tenant": r["tenant"],
        "sku": r["sku"],
        "gpu_count": r["gpu_count"],
        "region": r["region"],
        "image": r["image"],
        "ssh_keys": list(r["ssh_keys"]),
        "vm_profile": r["vm_profile"],
        "state": r["desired_state"],
        "requested_at": r["requested_at"],
        **({"lease_hours": r["lease_hours"]} if r.get("lease_hours") is not None else {}),
        **({"extra_ports": list(r["extra_ports"])} if r.get("extra_ports") else {}),
    }


def allocations(conn: Connection, *, include_released: bool = False) -> list[AllocationView]:
    """Allocations with their status, placement and claims (live ones, or all with include_released)."""
    with dberrors.wrapped("read allocations"):
        rows = _rows(
            conn,
            "SELECT a.*, n.name AS node FROM allocations a LEFT JOIN nodes n ON n.id = a.node_id"
            " ORDER BY a.requested_at, a.id",
        )
        claims = conn.execute(
            "SELECT c.allocation_id, n.name, c.slot_index, c.claim_kind, c.status FROM allocation_resource_claims c"
            " JOIN nodes n ON n.id = c.node_id ORDER BY c.allocation_id, c.slot_index NULLS FIRST"
        ).fetchall()
    by_alloc: dict[str, list[ClaimView]] = defaultdict(list)
    for aid, node, idx, kind, status in claims:
        by_alloc[str(aid)].append(ClaimView(str(node), idx, str(kind), str(status)))
    out = []
    for r in rows:
        if not include_released and (r["status"] == "released" or (r["status"] == "pending" and not r["present"])):
            continue
        placement = r["placement"] or {}
        profile = placement.get("profile")
        profile_name = profile.get("name") if isinstance(profile, dict) else profile
        out.append(
            AllocationView(
                id=r["id"],
                tenant=r["tenant"],
                sku=r["sku"],
                gpu_count=r["gpu_count"],
                region=r["region"],
                desired_state=r["desired_state"],
                status=r["status"],
                node=r["node"],
                slot_indexes=tuple(int(i) for i in placement.get("slot_indexes") or ()),
                vm_profile=profile_name or r["vm_profile"],
                pending_code=r["pending_code"],
                pending_message=r["pending_message"],
                claims=tuple(by_alloc.get(r["id"], ())),
                placed_at=r["placed_at"],
                active_at=r["active_at"],
            )
        )
    return out


def orphaned(conn: Connection) -> list[str]:
    """Allocations holding live claims that the desired state no longer declares (their file was deleted).

    Deleting a file never releases (only `state: released` does), so these
    keep their claims until someone decides; `plan` warns about the same set.
    """
    with dberrors.wrapped("read orphaned allocations"):
        rows = conn.execute(
            "SELECT DISTINCT a.id FROM allocations a JOIN allocation_resource_claims c ON c.allocation_id = a.id"
            " WHERE NOT a.present AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')"
            " ORDER BY a.id"
        ).fetchall()
    return [str(r[0]) for r in rows]


def inventory_generation(conn: Connection) -> int:
    """The counter every inventory write bumps (0 before the first sync): a saved plan pins it."""
    with dberrors.wrapped("read the inventory generation"):
        row = conn.execute("SELECT generation FROM inventory_generation").fetchone()
    return int(row[0]) if row else 0


def removed_nodes(conn: Connection) -> list[dict[str, Any]]:
    """Nodes git no longer declares (`present = false`) on which live claims remain.

    Removing a node file releases nothing, as removing an allocation file
    does not: the claims and the tenants' VMs live on. `status` keeps such a
    node in its node list and its claimed units in the capacity totals, with
    a warning, instead of dropping it silently.
    """
    with dberrors.wrapped("read removed nodes that hold claims"):
        rows = conn.execute(
            "SELECT n.name, n.region, a.sku, coalesce(a.capacity_shape, CASE WHEN c.claim_kind = 'node_exclusive'"
            " THEN 'baremetal' ELSE 'gpu_slice' END), c.allocation_id, c.slot_index, c.status"
            " FROM nodes n JOIN allocation_resource_claims c ON c.node_id = n.id"
            " JOIN allocations a ON a.id = c.allocation_id"
            " WHERE NOT n.present AND c.status IN ('reserved', 'provisioning', 'active', 'releasing')"
            " ORDER BY n.name, c.slot_index NULLS FIRST, c.allocation_id"
        ).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for name, region, sku, shape, alloc, slot, status in rows:
        node = out.setdefault(str(name), {"name": str(name), "region": str(region), "claims": []})
        node["claims"].append(
            {
                "allocation_id": str(alloc),
                "sku": str(sku),
                "capacity_shape": str(shape),
                "slot_index": slot,
                "status": str(status),
            }
        )
    return list(out.values())
