"""Inventory rows: what the sync writes for each document, and the content hash.

The inventory tables and their desired columns, a row builder per document
kind (a SlotMap's slot rows are built together), and the sha256 over every
typed document that names a revision without git. No database here: the
sync (store/inventory.py) compares these rows with the tables and writes them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from desired import models as m
from desired.state import Delta, DesiredState, delta_since
from policies import capability, eligibility, validation

if TYPE_CHECKING:  # the sync's memory is passed in; a type only, no import back at run time
    from reconciler.store.inventory import Memory

Row = dict[str, Any]
Item = tuple[tuple[Any, ...], tuple[Any, ...], Callable[[], Row]]  # key, documents, row builder


class JsonText(str):
    """A JSON column's value already serialised (by pydantic, in Rust): a cold sync's COPY sends it
    as it is; only a comparison with a stored row parses it (`inventorywrites.compared`)."""

    __slots__ = ()


def _json(model: Any, **options: Any) -> JsonText:
    return JsonText(model.__pydantic_serializer__.to_json(model, **options).decode())


_EMPTY_LIST = JsonText("[]")


def _json_list(models: tuple[Any, ...]) -> JsonText:
    if not models:  # a slot's blockers, nearly always none: one shared text, not a join per slot
        return _EMPTY_LIST
    return JsonText("[" + ",".join(_json(x) for x in models) + "]")


# JSON of shared leaf models (`desired.models.compact` makes equal ones one object: a fleet's slots share
# a handful of capacity records), by identity; the model is held, so its id is not reused meanwhile.
_shared_json: dict[int, tuple[Any, JsonText]] = {}
_MAX_SHARED_JSON = 4096


def _json_shared(model: Any) -> JsonText:
    hit = _shared_json.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    text = _json(model)
    if len(_shared_json) >= _MAX_SHARED_JSON:
        _shared_json.clear()
    _shared_json[id(model)] = (model, text)
    return text


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    kind: str
    key: tuple[str, ...]
    columns: tuple[str, ...]  # desired columns: compared, and written on change
    json_columns: frozenset[str] = frozenset()
    inet_columns: frozenset[str] = frozenset()  # built as text; compared as the address the table returns


# The Fleet's one row. host_liveness_ttl_s and max_provision_attempts are written by store/lifecycle.sync_settings.
FLEET = Table(
    "fleet_settings",
    "fleet",
    ("singleton",),
    (
        "name",
        "management_network",
        "placement",
        "graceful_shutdown_timeout_s",
        "readiness_timeout_s",
        "regions",
        "ingress",
        "machine_providers",
    ),
    frozenset({"management_network", "placement", "regions", "ingress", "machine_providers"}),
)
SKUS = Table(
    "sku_catalog",
    "sku",
    ("sku",),
    (
        "display_name",
        "capacity_shape",
        "accelerator_vendor",
        "accelerator_model",
        "allowed_gpu_counts",
        "gpu_count",
        "exclusive_node",
        "network_fabric",
        "topology_policy",
        "resource_profile",
        "gpu_hourly_price_minor",
        "currency",
        "active",
        "same_node_required",
        "readiness_timeout_seconds",
    ),
    frozenset({"topology_policy", "resource_profile"}),
)
IMAGES = Table(
    "os_images",
    "image",
    ("slug",),
    (
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
    ),
)
NODES = Table(
    "nodes",
    "node",
    ("name",),
    (
        "region",
        "pool",
        "hardware_tags",
        "profile_tags",
        "baremetal_sku",
        "admin_state",
        "storage_mode",
        "os_disk",
        "org",
        "firmware_version",
        "firmware_ready",
        "capability",
        "capability_reasons",
        "management_network",
        "public_addresses",
        "ingress",
        "machine",
    ),
    frozenset({"management_network", "ingress", "machine"}),
)
SLOTS = Table(
    "node_resource_slots",
    "slot",
    ("node_id", "slot_index"),
    (
        "gpu_model",
        "gpu_pci_address",
        "gpu_uuid",
        "numa_node",
        "slot_group",
        "pcie_pair",
        "nvme_device",
        "nvme_identity",
        "network_fabric",
        "fabric_vf_pci_address",
        "fabric_parent_device",
        "fabric_claim_mode",
        "mac_address",
        "private_ip",
        "vcpu_count",
        "memory_mib",
        "sharing_model",
        "max_claims",
        "parent_slot_id",
        "compute_milli",
        "capacity_metadata",
        "blockers",
        "approved",
        "enabled",
        "eligible",
        "ineligible_reasons",
    ),
    frozenset({"nvme_identity", "capacity_metadata", "blockers"}),
    frozenset({"private_ip"}),
)
ALLOCATIONS = Table(
    "allocations",
    "allocation",
    ("id",),
    (
        "tenant",
        "sku",
        "gpu_count",
        "region",
        "image",
        "ssh_keys",
        "vm_profile",
        "desired_state",
        "requested_at",
        "lease_hours",
        "extra_ports",
    ),
)


def content_hash(state: DesiredState, memory: Memory | None = None, delta: Delta | None = None) -> str:
    """sha256 naming every typed document of `state`: it changes iff a document changes.

    A document read from a file is named by git's blob id of that file and
    its place there (`Document.blob`, `index`): the same bytes type to the
    same model, so nothing is serialised (at 10,000 nodes dumping every model
    was 3 s of a cold start). A comment or layout edit of a file therefore
    changes the hash too. A model the state holds but no document typed (a
    state edited in code) is named by a sha256 of its JSON instead; a Memory
    that saw that object does not dump it again. For a state read by delta
    from the one it hashed last, only the tables of changed kinds are listed
    again (`Memory.hash_parts`); `delta` is how the reader built `state` from
    the state before it, when it did.
    """
    delta = delta_since(delta, memory.hashed()) if memory is not None and memory.hashed else None
    into = (memory.doc_hashes if delta is not None else memory.doc_hashes_used) if memory is not None else {}
    sources = state.sources

    def one(kind: str, name: str, obj: Any) -> str:
        src = sources.get((kind, name))
        if src is not None and src.model_id == id(obj) and src.doc.blob is not None:
            return f"git:{src.doc.blob}:{src.doc.index}"
        if memory is not None:
            hit = memory.doc_hashes.get(id(obj))
            if hit is not None and hit[0] is obj:
                into[id(obj)] = hit
                return hit[1]
        digest = hashlib.sha256(json.dumps(obj.model_dump(mode="json"), sort_keys=True, default=str).encode())
        into[id(obj)] = (obj, digest.hexdigest())
        return into[id(obj)][1]

    parts: dict[str, bytes] = {}
    for kind, table in _hash_tables(state):
        kept = memory.hash_parts.get(kind) if memory is not None and delta is not None else None
        doc_kind = _KINDS[kind]
        if kept is not None and doc_kind not in delta.kinds():  # type: ignore[union-attr]
            parts[kind] = kept
        elif doc_kind == "Fleet":
            parts[kind] = b"".join(
                f"{kind}\0{name}\0{one(doc_kind, obj.name, obj)}\n".encode() for name, obj in table.items()
            )
        else:
            parts[kind] = b"".join(
                f"{kind}\0{name}\0{one(doc_kind, name, table[name])}\n".encode() for name in sorted(table)
            )
    if memory is not None:
        base = delta.base() if delta is not None else None
        if base is None:
            memory.doc_hashes, memory.doc_hashes_used = memory.doc_hashes_used, {}
        else:  # replaced documents leave (the others were not looked at, and stay)
            old, new = dict(_hash_tables(base)), dict(_hash_tables(state))
            for kind, name in delta.keys:  # type: ignore[union-attr]
                attr, key = TABLE_OF[kind], name if kind != "Fleet" else ""
                gone = old[attr].get(key)
                if gone is not None and gone is not new[attr].get(key):
                    memory.doc_hashes.pop(id(gone), None)
        memory.hash_parts, memory.hashed = parts, weakref.ref(state)
    return _digest(parts, memory)


def _digest(parts: dict[str, bytes], memory: Memory | None) -> str:
    """sha256 of the parts joined in order. With a memory, the hasher resumes after the leading parts
    it hashed last time (the very same bytes): an allocation commit hashes the allocations' lines, not
    the 16 MB of node and slot map lines of 100,000 nodes. The value is the one-shot hash's."""
    h = hashlib.sha256()
    states: dict[str, tuple[bytes, Any]] = {}
    resume = memory is not None
    for kind, part in parts.items():
        was = memory.hash_states.get(kind) if memory is not None and resume else None
        if was is not None and was[0] is part:
            states[kind], h = was, was[1].copy()
            continue
        resume = False
        h.update(part)
        states[kind] = (part, h.copy())
    if memory is not None:
        memory.hash_states = states
    return h.hexdigest()


_KINDS = {
    "fleet": "Fleet",
    "skus": "Sku",
    "images": "Image",
    "nodes": "Node",
    "slot_maps": "SlotMap",
    "allocations": "Allocation",
}
TABLE_OF = {v: k for k, v in _KINDS.items()}  # document kind -> its DesiredState attribute


def _hash_tables(state: DesiredState) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("fleet", {"": state.fleet} if state.fleet else {}),
        ("skus", state.skus),
        ("images", state.images),
        ("nodes", state.nodes),
        ("slot_maps", state.slot_maps),
        ("allocations", state.allocations),
    ]


def revision_key(state: DesiredState, digest: str | None = None) -> str:
    return state.revision or f"tree:{(digest or content_hash(state))[:16]}"


def fleet_row(f: m.Fleet) -> Row:
    return {
        "name": f.name,
        "management_network": f.management_network.model_dump(mode="json"),
        "placement": f.placement.model_dump(mode="json"),
        "graceful_shutdown_timeout_s": f.graceful_shutdown_timeout_s,
        "readiness_timeout_s": f.readiness_timeout_seconds,
        "regions": [r.model_dump(mode="json") for r in f.regions],
        "ingress": f.ingress.model_dump(mode="json"),
        "machine_providers": [p.model_dump(mode="json") for p in f.machine_providers],
    }


def sku_row(s: m.Sku) -> Row:
    return {
        "sku": s.sku,
        "display_name": s.display_name,
        "capacity_shape": s.capacity_shape.value,
        "accelerator_vendor": s.accelerator_vendor,
        "accelerator_model": s.accelerator_model,
        "allowed_gpu_counts": list(s.counts),
        "gpu_count": s.gpu_count,
        "exclusive_node": s.exclusive_node,
        "network_fabric": s.network_fabric.value,
        "topology_policy": s.topology_policy.model_dump(mode="json"),
        "resource_profile": s.resource_profile.model_dump(mode="json"),
        "gpu_hourly_price_minor": s.gpu_hourly_price_minor,
        "currency": s.currency,
        "active": s.active,
        "same_node_required": s.same_node_required,
        "readiness_timeout_seconds": s.readiness_timeout_seconds,
    }


def image_row(i: m.Image) -> Row:
    row: Row = i.model_dump(mode="json", include=set(IMAGES.columns) | {"slug"})
    row["compatible_skus"] = list(i.compatible_skus)
    return row


def node_row(state: DesiredState, n: m.Node) -> Row:
    smap = state.slot_maps.get(n.name)
    eligible = sum(1 for why in eligibility.eligible_slots(smap).values() if not why) if smap else 0
    verdict = capability.node_capability(n, firmware_ready=n.firmware_ready, eligible_slots=eligible)
    return {
        "name": n.name,
        "region": n.region,
        "pool": n.pool,
        "hardware_tags": list(n.hardware_tags),
        "profile_tags": list(n.profile_tags),
        "baremetal_sku": n.baremetal_sku,
        "admin_state": n.admin_state.value,
        "storage_mode": n.storage_mode.value,
        "os_disk": n.os_disk,
        "org": n.org,
        "firmware_version": n.firmware_profile.version if n.firmware_profile else None,
        "firmware_ready": n.firmware_ready,
        "capability": verdict.capability.value,
        "capability_reasons": [code for code, _ in verdict.reasons],
        "management_network": _json(validation.management_network(state, n)),
        "public_addresses": list(n.public_addresses),
        "ingress": _json(n.ingress) if n.ingress is not None else None,
        "machine": _json(n.machine) if n.machine is not None else None,
    }


def _slot_rows(smap: m.SlotMap, node_id: Any) -> Iterable[Row]:
    reasons = eligibility.eligible_slots(smap)
    for s in smap.slots:
        why = reasons.get(s.slot_index, [])
        yield {
            "node_id": node_id,
            "slot_index": s.slot_index,
            "gpu_model": s.gpu_model,
            "gpu_pci_address": s.gpu_pci_address,
            "gpu_uuid": s.gpu_uuid,
            "numa_node": s.numa_node,
            "slot_group": s.slot_group,
            "pcie_pair": s.pcie_pair,
            "nvme_device": s.nvme_device,
            "nvme_identity": _json(s.nvme_identity, exclude_none=True) if s.nvme_identity else None,
            "network_fabric": s.network_fabric.value,
            "fabric_vf_pci_address": s.fabric_vf_pci_address,
            "fabric_parent_device": s.fabric_parent_device,
            "fabric_claim_mode": s.fabric_claim_mode.value if s.fabric_claim_mode else None,
            "mac_address": s.mac_address,
            "private_ip": s.private_ip,
            "vcpu_count": s.vcpu_count,
            "memory_mib": s.memory_mib,
            "sharing_model": s.sharing_model.value,
            "max_claims": s.max_claims,
            "parent_slot_id": s.parent_slot_id,
            "compute_milli": s.compute_milli,
            "capacity_metadata": _json_shared(s.capacity_metadata),
            "blockers": _json_list(s.blockers),
            "approved": not smap.approval_required,
            "enabled": s.enabled,
            "eligible": not why,
            "ineligible_reasons": [r.code for r in why],
        }


def allocation_row(a: m.Allocation) -> Row:
    requested = a.requested_at if a.requested_at.tzinfo else a.requested_at.replace(tzinfo=dt.UTC)
    return {
        "id": a.id,
        "tenant": a.tenant,
        "sku": a.sku,
        "gpu_count": a.gpu_count,
        "region": a.region,
        "image": a.image,
        "ssh_keys": list(a.ssh_keys),
        "vm_profile": a.vm_profile,
        "desired_state": a.state.value,
        "requested_at": requested,
        "lease_hours": a.lease_hours,
        "extra_ports": list(a.extra_ports),
    }


def slot_items(smap: m.SlotMap, node_id: Any) -> list[Item]:
    rows: list[Row] = []

    def row(i: int) -> Row:
        if not rows:
            rows.extend(_slot_rows(smap, node_id))
        built = rows[i]
        if i == len(rows) - 1:  # the map's rows are built together and asked for in order: let them go
            rows.clear()
        return built

    return [((node_id, s.slot_index), (smap,), partial(row, i)) for i, s in enumerate(smap.slots)]


def slot_work(
    state: DesiredState, node_ids: dict[str, Any], memory: Memory | None
) -> tuple[list[Item], list[tuple[Any, ...]]]:
    """Slot rows to build and compare, and the keys of rows known in place without a look.

    With a trusted memory, a SlotMap that is the very object of the last sync
    wrote its rows already: its slots are neither itemised nor compared (at
    10,000 nodes that was half of a commit's cost), only counted as wanted.
    """
    items: list[Item] = []
    kept: list[tuple[Any, ...]] = []
    for name, smap in sorted(state.slot_maps.items()):
        node_id = node_ids.get(name)
        if node_id is None:
            continue
        last = memory.slot_maps.get(name) if memory is not None else None
        if last is not None and last[0] is smap and last[1] == node_id:
            kept.extend(last[2])
            continue
        mine = slot_items(smap, node_id)
        items.extend(mine)
        if memory is not None:
            memory.slot_maps[name] = (smap, node_id, tuple(key for key, _, _ in mine))
    if memory is not None and len(memory.slot_maps) > len(state.slot_maps):
        for gone in set(memory.slot_maps) - set(state.slot_maps):
            del memory.slot_maps[gone]
    return items, kept


class _Work:
    """The documents of a table the sync itemises: all of them, or with a delta only the changed ones."""

    def __init__(self, state: DesiredState, delta: Delta | None) -> None:
        self.state, self.delta = state, delta

    def names(self, *kinds: str) -> set[str] | None:
        if self.delta is None:
            return None
        return set().union(*(self.delta.names(k) for k in kinds))

    def docs(self, *kinds: str) -> list[Any]:
        table: dict[str, Any] = getattr(self.state, TABLE_OF[kinds[0]])
        names = self.names(*kinds)
        if names is None:  # by name, as a delta's are: rows are written in that order (ids follow it)
            return [table[n] for n in sorted(table)]
        return [table[n] for n in sorted(names) if n in table]

    def gone(self, *kinds: str) -> list[tuple[Any, ...]] | None:
        """Keys of rows that may have gone: None, every row not wanted (no delta)."""
        names = self.names(*kinds)
        return None if names is None else [(n,) for n in sorted(names)]
