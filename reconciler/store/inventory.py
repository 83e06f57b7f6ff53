"""Inventory sync: project the desired state at a revision into rows.

Upsert what git declares, mark `present = false` what disappeared (rows that
claims or billing reference are never deleted), and record the revision.
The sync reads the current rows first and writes only the differences, so
re-running the same revision takes no row lock and writes nothing at all,
and placements running beside it never lose a race to a no-op.

Each row remembers the revision that last changed it (`revision`); the
`desired_revisions` table remembers every revision synced and its content
hash (a plain directory without git is recorded as `tree:<hash>`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

from desired import models as m
from desired.loading import DesiredState
from policies import capability, eligibility, validation
from reconciler.store import errors
from reconciler.store.connections import Connection

_LOCK_KEY = 0x67707561_0001

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    kind: str  # sku | image | node | slot | allocation | fleet
    key: str
    action: str  # added | changed | removed | restored

    def render(self) -> str:
        return f"{self.kind} {self.key} {self.action}"


@dataclass(frozen=True, slots=True)
class SyncResult:
    revision: str
    content_hash: str
    new_revision: bool
    changes: tuple[Change, ...] = field(default=())

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    def counts(self) -> dict[str, int]:
        return dict(Counter(f"{c.kind}.{c.action}" for c in self.changes))


@dataclass(frozen=True, slots=True)
class _Table:
    name: str
    kind: str
    key: tuple[str, ...]
    columns: tuple[str, ...]  # desired columns: compared, and written on change
    json_columns: frozenset[str] = frozenset()


SKUS = _Table("sku_catalog", "sku", ("sku",), (
    "display_name", "capacity_shape", "accelerator_vendor", "accelerator_model", "allowed_gpu_counts",
    "gpu_count", "exclusive_node", "network_fabric", "topology_policy", "resource_profile",
    "gpu_hourly_price_minor", "currency", "active"), frozenset({"topology_policy", "resource_profile"}))
IMAGES = _Table("os_images", "image", ("slug",), (
    "display_name", "version", "target", "family", "architecture", "accelerator_vendor",
    "accelerator_model", "network_fabric", "image_format", "source_type", "source_ref", "digest_sha256",
    "size_bytes", "cloud_init_supported", "guest_agent_supported", "default_username", "driver_strategy",
    "compatible_skus", "active"))
NODES = _Table("nodes", "node", ("name",), (
    "region", "pool", "hardware_tags", "profile_tags", "baremetal_sku", "admin_state", "storage_mode",
    "os_disk", "org", "firmware_version", "firmware_ready", "capability", "capability_reasons",
    "management_network"), frozenset({"management_network"}))
SLOTS = _Table("node_resource_slots", "slot", ("node_id", "slot_index"), (
    "gpu_model", "gpu_pci_address", "gpu_uuid", "numa_node", "slot_group", "pcie_pair", "nvme_device",
    "nvme_identity", "network_fabric", "fabric_vf_pci_address", "fabric_parent_device", "fabric_claim_mode",
    "mac_address", "private_ip", "vcpu_count", "memory_mib", "sharing_model", "max_claims",
    "parent_slot_id", "compute_milli", "capacity_metadata", "blockers", "approved", "enabled",
    "eligible", "ineligible_reasons"), frozenset({"nvme_identity", "capacity_metadata", "blockers"}))
ALLOCATIONS = _Table("allocations", "allocation", ("id",), (
    "tenant", "sku", "gpu_count", "region", "image", "ssh_keys", "vm_profile", "desired_state",
    "requested_at"))


def content_hash(state: DesiredState) -> str:
    """sha256 over every typed document, independent of file layout and comments."""
    doc = {
        "fleet": state.fleet.model_dump(mode="json") if state.fleet else None,
        "skus": {k: v.model_dump(mode="json") for k, v in state.skus.items()},
        "images": {k: v.model_dump(mode="json") for k, v in state.images.items()},
        "nodes": {k: v.model_dump(mode="json") for k, v in state.nodes.items()},
        "slot_maps": {k: v.model_dump(mode="json") for k, v in state.slot_maps.items()},
        "allocations": {k: v.model_dump(mode="json") for k, v in state.allocations.items()},
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def revision_key(state: DesiredState, digest: str | None = None) -> str:
    return state.revision or f"tree:{(digest or content_hash(state))[:16]}"


def sync(conn: Connection, state: DesiredState) -> SyncResult:
    """Project `state` into the inventory tables in one transaction."""
    digest = content_hash(state)
    revision = revision_key(state, digest)
    changes: list[Change] = []
    with errors.wrapped("sync inventory"), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        changes += _sync_fleet(conn, state, revision)
        changes += _sync_table(conn, SKUS, [_sku_row(s) for s in state.skus.values()], revision)
        changes += _sync_table(conn, IMAGES, [_image_row(i) for i in state.images.values()], revision)
        changes += _sync_table(conn, NODES, [_node_row(state, n) for n in state.nodes.values()], revision)
        node_ids = {str(name): node_id for name, node_id in conn.execute("SELECT name, id FROM nodes")}
        slot_rows = [row for name, smap in sorted(state.slot_maps.items()) if name in node_ids
                     for row in _slot_rows(smap, node_ids[name])]
        names = {v: k for k, v in node_ids.items()}
        changes += _sync_table(conn, SLOTS, slot_rows, revision,
                               label=lambda key: f"{names.get(key[0], key[0])}:{key[1]}")
        _slot_statuses(conn)
        changes += _sync_table(conn, ALLOCATIONS, [_allocation_row(a) for a in state.allocations.values()],
                               revision)
        new_revision = conn.execute("SELECT 1 FROM desired_revisions WHERE revision = %s",
                                    (revision,)).fetchone() is None
        if new_revision:
            counts = {"nodes": len(state.nodes), "slots": len(slot_rows), "skus": len(state.skus),
                      "images": len(state.images), "allocations": len(state.allocations)}
            conn.execute(
                "INSERT INTO desired_revisions (revision, content_hash, file_count, counts)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (revision) DO NOTHING",
                (revision, digest, state.file_count, _jsonb(counts)))
    return SyncResult(revision, digest, new_revision, tuple(changes))


def changed_nodes(changes: Iterable[Change]) -> set[str]:
    """Nodes whose host plan inputs changed: the node row or one of its slots (a host plan reads
    nothing else of the inventory but the fleet settings; SKU and image edits reach running VMs
    only through claim snapshots, never by a sync)."""
    out = {c.key for c in changes if c.kind == "node"}
    out |= {c.key.rsplit(":", 1)[0] for c in changes if c.kind == "slot"}
    return out


# ------------------------------------------------------------------ rows


def _sku_row(s: m.Sku) -> Row:
    return {
        "sku": s.sku, "display_name": s.display_name, "capacity_shape": s.capacity_shape.value,
        "accelerator_vendor": s.accelerator_vendor, "accelerator_model": s.accelerator_model,
        "allowed_gpu_counts": list(s.counts), "gpu_count": s.gpu_count, "exclusive_node": s.exclusive_node,
        "network_fabric": s.network_fabric.value, "topology_policy": s.topology_policy.model_dump(mode="json"),
        "resource_profile": s.resource_profile.model_dump(mode="json"),
        "gpu_hourly_price_minor": s.gpu_hourly_price_minor, "currency": s.currency, "active": s.active,
    }


def _image_row(i: m.Image) -> Row:
    row: Row = i.model_dump(mode="json", include=set(IMAGES.columns) | {"slug"})
    row["compatible_skus"] = list(i.compatible_skus)
    return row


def _node_row(state: DesiredState, n: m.Node) -> Row:
    smap = state.slot_maps.get(n.name)
    eligible = sum(1 for why in eligibility.eligible_slots(smap).values() if not why) if smap else 0
    verdict = capability.node_capability(n, firmware_ready=n.firmware_ready, eligible_slots=eligible)
    return {
        "name": n.name, "region": n.region, "pool": n.pool, "hardware_tags": list(n.hardware_tags),
        "profile_tags": list(n.profile_tags), "baremetal_sku": n.baremetal_sku,
        "admin_state": n.admin_state.value, "storage_mode": n.storage_mode.value, "os_disk": n.os_disk,
        "org": n.org, "firmware_version": n.firmware_profile.version if n.firmware_profile else None,
        "firmware_ready": n.firmware_ready, "capability": verdict.capability.value,
        "capability_reasons": [code for code, _ in verdict.reasons],
        "management_network": validation.management_network(state, n).model_dump(mode="json"),
    }


def _slot_rows(smap: m.SlotMap, node_id: Any) -> Iterable[Row]:
    reasons = eligibility.eligible_slots(smap)
    for s in smap.slots:
        why = reasons.get(s.slot_index, [])
        yield {
            "node_id": node_id, "slot_index": s.slot_index, "gpu_model": s.gpu_model,
            "gpu_pci_address": s.gpu_pci_address, "gpu_uuid": s.gpu_uuid, "numa_node": s.numa_node,
            "slot_group": s.slot_group, "pcie_pair": s.pcie_pair, "nvme_device": s.nvme_device,
            "nvme_identity": s.nvme_identity.model_dump(mode="json", exclude_none=True) if s.nvme_identity else None,
            "network_fabric": s.network_fabric.value, "fabric_vf_pci_address": s.fabric_vf_pci_address,
            "fabric_parent_device": s.fabric_parent_device,
            "fabric_claim_mode": s.fabric_claim_mode.value if s.fabric_claim_mode else None,
            "mac_address": s.mac_address, "private_ip": ipaddress.ip_address(s.private_ip),
            "vcpu_count": s.vcpu_count, "memory_mib": s.memory_mib, "sharing_model": s.sharing_model.value,
            "max_claims": s.max_claims, "parent_slot_id": s.parent_slot_id, "compute_milli": s.compute_milli,
            "capacity_metadata": s.capacity_metadata.model_dump(mode="json"),
            "blockers": [b.model_dump(mode="json") for b in s.blockers],
            "approved": not smap.approval_required, "enabled": s.enabled, "eligible": not why,
            "ineligible_reasons": [r.code for r in why],
        }


def _allocation_row(a: m.Allocation) -> Row:
    requested = a.requested_at if a.requested_at.tzinfo else a.requested_at.replace(tzinfo=dt.UTC)
    return {
        "id": a.id, "tenant": a.tenant, "sku": a.sku, "gpu_count": a.gpu_count, "region": a.region,
        "image": a.image, "ssh_keys": list(a.ssh_keys), "vm_profile": a.vm_profile,
        "desired_state": a.state.value, "requested_at": requested,
    }


# --------------------------------------------------------------- writing


def _jsonb(value: Any) -> Any:
    from psycopg.types.json import Jsonb

    return Jsonb(value)


def _plain_json(value: Any) -> Any:
    """What jsonb gives back: string keys only (e.g. workload_mix {1: 0.4} -> {"1": 0.4})."""
    return json.loads(json.dumps(value))


def _params(table: _Table, row: Row, revision: str) -> Row:
    # None stays SQL NULL (an optional JSON column such as nvme_identity), not JSON null.
    out = {k: _jsonb(v) if k in table.json_columns and v is not None else v for k, v in row.items()}
    out["revision"] = revision
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _sync_table(conn: Connection, table: _Table, rows: Sequence[Row], revision: str,
                label: Any = None) -> list[Change]:
    name = sql.Identifier(table.name)
    keys = sql.SQL(", ").join(map(sql.Identifier, table.key))
    cols = sql.SQL(", ").join(map(sql.Identifier, table.columns))
    current: dict[tuple[Any, ...], tuple[bool, tuple[Any, ...]]] = {}
    query = sql.SQL("SELECT {keys}, present, {cols} FROM {name}").format(keys=keys, cols=cols, name=name)
    n = len(table.key)
    for rec in conn.execute(query):
        current[tuple(rec[:n])] = (bool(rec[n]), tuple(rec[n + 1:]))

    def show(key: tuple[Any, ...]) -> str:
        return str(label(key)) if label else ":".join(str(k) for k in key)

    inserts: list[Row] = []
    updates: list[Row] = []
    changes: list[Change] = []
    wanted: set[tuple[Any, ...]] = set()
    for row in rows:
        key = tuple(row[k] for k in table.key)
        wanted.add(key)
        values = tuple(_plain_json(row[c]) if c in table.json_columns else row[c] for c in table.columns)
        if key not in current:
            inserts.append(row)
            changes.append(Change(table.kind, show(key), "added"))
            continue
        present, have = current[key]
        if not present or not _same(have, values):
            updates.append(row)
            changes.append(Change(table.kind, show(key), "changed" if present else "restored"))
    gone = [key for key, (present, _) in current.items() if present and key not in wanted]
    changes += [Change(table.kind, show(key), "removed") for key in sorted(gone, key=str)]

    every = (*table.key, *table.columns)
    if inserts:
        stmt = sql.SQL("INSERT INTO {name} ({cols}, present, revision) VALUES ({vals}, true, %(revision)s)").format(
            name=name, cols=sql.SQL(", ").join(map(sql.Identifier, every)),
            vals=sql.SQL(", ").join(sql.Placeholder(c) for c in every))
        conn.cursor().executemany(stmt, [_params(table, r, revision) for r in inserts])
    if updates:
        stmt = sql.SQL("UPDATE {name} SET {sets}, present = true, revision = %(revision)s, updated_at = now()"
                       " WHERE {where}").format(
            name=name,
            sets=sql.SQL(", ").join(sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder(c))
                                    for c in table.columns),
            where=sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k))
                                        for k in table.key))
        conn.cursor().executemany(stmt, [_params(table, r, revision) for r in updates])
    if gone:
        stmt = sql.SQL("UPDATE {name} SET present = false, revision = %(revision)s, updated_at = now()"
                       " WHERE {where}").format(
            name=name,
            where=sql.SQL(" AND ").join(sql.SQL("{} = {}").format(sql.Identifier(k), sql.Placeholder(k))
                                        for k in table.key))
        conn.cursor().executemany(stmt, [{**dict(zip(table.key, key, strict=True)), "revision": revision}
                                         for key in gone])
    return changes


def _slot_statuses(conn: Connection) -> None:
    """A free slot git no longer offers is disabled; one offered again is available."""
    conn.execute("UPDATE node_resource_slots SET status = 'disabled', updated_at = now()"
                 " WHERE status = 'available' AND NOT (present AND enabled)")
    conn.execute("UPDATE node_resource_slots SET status = 'available', updated_at = now()"
                 " WHERE status = 'disabled' AND present AND enabled")


def _sync_fleet(conn: Connection, state: DesiredState, revision: str) -> list[Change]:
    fleet = state.fleet
    if fleet is None:
        return []
    row = {
        "name": fleet.name, "management_network": fleet.management_network.model_dump(mode="json"),
        "placement": fleet.placement.model_dump(mode="json"),
        "graceful_shutdown_timeout_s": fleet.graceful_shutdown_timeout_s,
        "readiness_timeout_s": fleet.readiness_timeout_s,
    }
    have = conn.execute("SELECT name, management_network, placement, graceful_shutdown_timeout_s,"
                        " readiness_timeout_s FROM fleet_settings").fetchone()
    plain = {k: _plain_json(v) if isinstance(v, dict) else v for k, v in row.items()}
    if have is not None and _same(tuple(have), tuple(plain.values())):
        return []
    conn.execute(
        "INSERT INTO fleet_settings (singleton, name, management_network, placement,"
        " graceful_shutdown_timeout_s, readiness_timeout_s, revision)"
        " VALUES (true, %(name)s, %(management_network)s, %(placement)s, %(graceful_shutdown_timeout_s)s,"
        " %(readiness_timeout_s)s, %(revision)s)"
        " ON CONFLICT (singleton) DO UPDATE SET name = EXCLUDED.name,"
        " management_network = EXCLUDED.management_network, placement = EXCLUDED.placement,"
        " graceful_shutdown_timeout_s = EXCLUDED.graceful_shutdown_timeout_s,"
        " readiness_timeout_s = EXCLUDED.readiness_timeout_s, revision = EXCLUDED.revision,"
        " updated_at = now()",
        {**{k: _jsonb(v) if isinstance(v, dict) else v for k, v in row.items()}, "revision": revision})
    return [Change("fleet", fleet.name, "added" if have is None else "changed")]

