"""The status document: capacity, nodes and allocations as the store holds them.

`gpuaas status -o json` prints it and `gpuaas serve` serves it (the capacity
endpoint, the dashboard, the fleet gauges), both from `document`, so the two
cannot disagree. Per region x SKU: launchable counts for each allowed GPU
count (what the planner would still place, not raw free slots) and why free
slots are not launchable, with prices; node summaries (capability, mode,
slots by status, health reasons, drift, machine state); allocations with
their claims, lifecycle, lease, endpoints and whether git still declares
them; the reconciliation's health. It reads the store only: the desired
state is the inventory the last reconciliation synced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reconciler import codes as reconciler_codes

if TYPE_CHECKING:
    from desired import models as m
    from reconciler.placement import capacity
    from reconciler.store.connections import Connection


def document(conn: Connection, *, policy: str | None = None) -> dict[str, Any]:
    """The whole status document (plain data), read on `conn`."""
    from reconciler.placement import capacity
    from reconciler.store import endpoints, history, leases, lifecycle, live, migrations, views
    from schemas.errors import PermanentError

    if not migrations.applied(conn):
        raise PermanentError(
            "the database has no schema yet: nothing was reconciled (run `gpuaas run`)",
            code=reconciler_codes.STATUS_NO_SCHEMA,
        )
    state = views.desired_state(conn)
    observed = live.observe(conn)
    allocations = views.allocations(conn)
    health = history.health(conn)
    node_reasons = lifecycle.health_reasons(conn)
    cycles = lifecycle.lifecycles(conn)
    orphaned = views.orphaned(conn)
    leased = leases.details(conn)
    machines = leases.node_states(conn)
    machine_drift = leases.drift(conn)
    removed = views.removed_nodes(conn)
    reachable = endpoints.current(conn)
    regions = lifecycle.disruption(conn)
    try:
        model = capacity.read_model(state, observed, policy=policy)
    except ValueError as e:
        raise PermanentError(str(e), code=reconciler_codes.STATUS_POLICY_UNKNOWN) from e
    doc = as_dict(state.revision, model, allocations)
    priced(doc["capacity"], state.skus)  # the portal's price per region x SKU x GPU count
    add_lifecycle(doc, node_reasons, cycles)
    add_baremetal(doc, leased, machines, machine_drift)
    doc["reconciliation"] = {
        "last_applied_revision": health.last_applied_revision,
        "last_applied_at": health.last_applied_at,
        "failing": {
            "since": health.failing_since,
            "failures": health.failures,
            "revision": health.failing_revision,
            "code": health.failing_code,
            "message": health.failing_message,
        }
        if health.failing
        else None,
        "invalid_revision": health.invalid_revision,
        "head": None
        if health.head is None
        else {
            "revision": health.head.revision,
            "applied": health.head.applied,
            "since": health.head.since,
            "code": health.head.code,
            "message": health.head.message,
        },
    }
    # Allocations holding claims whose file was deleted: only `state: released` frees them (as `plan` warns).
    doc["orphaned"] = orphaned
    doc["disrupted_regions"] = [r for r in regions if r["disrupted"]]
    for a in doc["allocations"]:
        a["orphaned"] = a["id"] in orphaned
        a["endpoints"] = [e.as_dict() for e in reachable.get(a["id"], ())]
    add_removed(doc, removed)
    return doc


def price_of(sku: m.Sku, gpu_count: int) -> int:
    """An offer's hourly price in the currency's minor unit: n GPUs cost n times the SKU's GPU-hour."""
    return sku.gpu_hourly_price_minor * gpu_count


def priced(capacity: list[dict[str, Any]], sku_map: Mapping[str, m.Sku]) -> list[dict[str, Any]]:
    """The capacity document's offers, each size with its hourly price (in place; returned for chaining)."""
    for offer in capacity:
        sku = sku_map.get(offer["sku"])
        if sku is None:
            continue
        offer["price"] = {"currency": sku.currency, "gpu_hourly_minor": sku.gpu_hourly_price_minor}
        for size in [*offer["sizes"], *(s for sizes in offer["dedicated"].values() for s in sizes)]:
            size["hourly_price_minor"] = price_of(sku, size["gpu_count"])
    return capacity


def add_removed(doc: dict[str, Any], removed: Sequence[dict[str, Any]]) -> None:
    """Nodes removed from git that still hold claims: listed, and their claimed units counted in use.

    The read model is built from what git declares, so such a node would
    vanish from the node list and the totals; its tenants' allocations live
    on (removing a file releases nothing). A unit here is a slot of a slice
    claim or the whole node of a baremetal one, counted on the offer of the
    allocation's SKU in the node's region (`removed_in_use`).
    """
    doc["removed_nodes"] = [n["name"] for n in removed]
    offers = {(o["region"], o["sku"]): o for o in doc["capacity"]}
    for n in removed:
        claims = n["claims"]
        doc["nodes"].append(
            {
                "name": n["name"],
                "region": n["region"],
                "pool": None,
                "org": None,
                "admin_state": "removed",
                "healthy": True,
                "capability": "-",
                "capability_reasons": [],
                "mode": "removed",
                "slots": {
                    s: sum(1 for c in claims if c["status"] == s and c["slot_index"] is not None)
                    for s in sorted({c["status"] for c in claims if c["slot_index"] is not None})
                },
                "allocations": sorted({c["allocation_id"] for c in claims}),
                "drained": False,
                "removed": True,
                "corrupt": [],
                "host_drift": [],
                "claims": claims,
            }
        )
        units: dict[tuple[str, str], set[tuple[str, int | None]]] = {}
        for c in claims:
            unit = (c["allocation_id"], None) if c["capacity_shape"] == "baremetal" else (n["name"], c["slot_index"])
            units.setdefault((n["region"], c["sku"]), set()).add(unit)
        for key, held in sorted(units.items()):
            offer = offers.get(key)
            if offer is None:  # every node of the product is gone from git: the offer is only what they hold
                shape = next(c["capacity_shape"] for c in claims if c["sku"] == key[1])
                offer = offers[key] = {
                    "region": key[0],
                    "sku": key[1],
                    "capacity_shape": shape,
                    "unit": "node" if shape == "baremetal" else "slot",
                    "total": 0,
                    "in_use": 0,
                    "free": 0,
                    "usable": 0,
                    "not_launchable": {},
                    "sizes": [],
                    "dedicated": {},
                }
                doc["capacity"].append(offer)
            offer["total"] += len(held)
            offer["in_use"] += len(held)
            offer["removed_in_use"] = offer.get("removed_in_use", 0) + len(held)


def as_dict(revision: str | None, model: capacity.ReadModel, allocations: Sequence[Any]) -> dict[str, Any]:
    return {
        "revision": revision,
        "capacity": [
            {
                "region": o.region,
                "sku": o.sku,
                "capacity_shape": o.capacity_shape,
                "unit": o.unit,
                "total": o.total,
                "in_use": o.in_use,
                "free": o.free,
                "usable": o.usable,
                "not_launchable": dict(o.not_launchable),
                "sizes": [_size(s) for s in o.sizes],
                "dedicated": {org: [_size(s) for s in sizes] for org, sizes in o.dedicated.items()},
            }
            for o in model.offers
        ],
        "nodes": [
            {
                "name": n.name,
                "region": n.region,
                "pool": n.pool,
                "org": n.org,
                "admin_state": n.admin_state,
                "healthy": n.healthy,
                "capability": n.capability,
                "capability_reasons": list(n.capability_reasons),
                "mode": n.mode,
                "slots": dict(n.slots),
                "allocations": list(n.allocations),
                "drained": n.drained,
                # what its host reports (policies.hostreports): drifted slots are not placed, a corrupt node is not
                "corrupt": list(n.corrupt),
                "host_drift": [{"slot_index": i, "codes": list(codes)} for i, codes in n.drifted],
            }
            for n in model.nodes
        ],
        "allocations": [
            {
                "id": a.id,
                "tenant": a.tenant,
                "sku": a.sku,
                "gpu_count": a.gpu_count,
                "region": a.region,
                "desired_state": a.desired_state,
                "status": a.status,
                "node": a.node,
                "slot_indexes": list(a.slot_indexes),
                "vm_profile": a.vm_profile,
                "pending": {"code": a.pending_code, "message": a.pending_message} if a.pending_code else None,
                "claims": [
                    {"node": c.node, "slot_index": c.slot_index, "kind": c.kind, "status": c.status} for c in a.claims
                ],
                "placed_at": a.placed_at,
                "active_at": a.active_at,
            }
            for a in allocations
        ],
    }


def _size(s: capacity.Size) -> dict[str, Any]:
    return {
        "gpu_count": s.gpu_count,
        "launchable": s.launchable,
        "stranded_gpus": s.stranded_gpus,
        "limit": {"code": s.limit_code, "message": s.limit_message} if s.launchable == 0 and s.limit_code else None,
    }


def add_baremetal(
    doc: dict[str, Any],
    leased: dict[str, dict[str, Any]],
    machines: dict[str, dict[str, Any]],
    drift: list[dict[str, Any]],
) -> None:
    """Each lease's provider view, each node's machine state, and the providers' drift."""
    for a in doc["allocations"]:
        lease = leased.get(a["id"])
        a["baremetal"] = (
            None
            if lease is None
            else {
                k: lease[k]
                for k in (
                    "provider",
                    "machine_id",
                    "node",
                    "phase",
                    "provider_state",
                    "provider_message",
                    "ssh_endpoint",
                    "wait_code",
                    "wait_message",
                    "deploy_requests",
                    "erase_requests",
                    "timings_s",
                )
            }
        )
    for n in doc["nodes"]:
        n["machine"] = machines.get(n["name"])
    doc["machine_drift"] = drift


def add_lifecycle(
    doc: dict[str, Any], node_reasons: dict[str, list[dict[str, Any]]], cycles: dict[str, dict[str, Any]]
) -> None:
    """Node health reasons and each allocation's lifecycle (reconciler.store.lifecycle) into the document."""
    for n in doc["nodes"]:
        reasons = node_reasons.get(n["name"], [])
        n["unavailable"] = any(r["code"] == "host.silent" for r in reasons)
        n["health_reasons"] = reasons
    for a in doc["allocations"]:
        c = cycles.get(a["id"])
        a["lifecycle"] = (
            None
            if c is None
            else {
                "state": c["state"],
                "host_phase": c["host_phase"],
                "boot_ip": c["boot_ip"],
                "host_unreachable": bool(c["host_unreachable"]),
                "failed_attempts": c["failed_attempts"],
                "failure": {"code": c["failure_code"], "message": c["failure_message"]} if c["failure_code"] else None,
                "attempts": [
                    {
                        "attempt": t["attempt"],
                        "node": t["node"],
                        "phase": t["phase"],
                        "code": t["code"],
                        "message": t["message"],
                        "outcome": t["outcome"],
                        "quarantined": t["quarantined"],
                    }
                    for t in c["attempts"]
                ],
            }
        )
