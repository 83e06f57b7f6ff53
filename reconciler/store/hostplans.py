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
leaves every plan (and every host) alone. Plans are built and stored as sets
(BATCH nodes per transaction: bulk reads, a COPY and one upsert). Writers of
a node are serialised by its advisory lock (a batch takes its locks in name
order) and read the claims after taking it, so a plan can never be
overwritten by one built from older claims.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from desired import defaults
from reconciler.store.connections import Connection
from schemas import dberrors, progress, snapshots
from schemas import hostplans as codec
from schemas.errors import PermanentError


@dataclass(frozen=True, slots=True)
class Written:
    node: str
    generation: int
    changed: bool


# Nodes per transaction: each holds one advisory lock per node (PostgreSQL's shared lock table has room
# for max_locks_per_transaction x max_connections), and a failure loses at most one batch's work.
BATCH = 1000
_LIVE = ("reserved", "provisioning", "active", "releasing")
_LOCK = (
    "SELECT count(pg_advisory_xact_lock(hashtext('gpuaas.host_plan'), hashtext(n)))"
    " FROM (SELECT n FROM unnest(%s::text[]) n ORDER BY n) s"
)


def _bundle(slot: snapshots.SnapshotSlot) -> codec.SlotBundle:
    return codec.SlotBundle(
        slot_index=slot.slot_index,
        gpu_pci_address=slot.gpu_pci_address,
        fabric_vf_pci_address=slot.fabric_vf_pci_address,
        nvme_device=slot.nvme_device,
        mac_address=slot.mac_address,
        private_ip=slot.private_ip,
        numa_node=slot.numa_node,
    )


def _vm(allocation_id: str, claims: list[tuple[str, snapshots.SlotClaimSnapshot]]) -> codec.VmSpec:
    claims = sorted(claims, key=lambda c: c[1].slot.slot_index)
    cid, snap = claims[0]
    if snap.profile is None:
        where = f"snapshot of claim {cid} ({allocation_id})"
        raise PermanentError(f"{where}: a slice VM's claim records no profile", code=snapshots.NO_PROFILE)
    profile, image = snap.profile, snap.image
    return codec.VmSpec(
        allocation_id=allocation_id,
        tenant=snap.tenant,
        bundles=tuple(_bundle(s.slot) for _, s in claims),
        vcpu_count=profile.vcpu_count,
        memory_mib=profile.memory_mib,
        hugepages=profile.hugepages_enabled,
        hugepage_size=profile.hugepage_size,
        image=codec.ImageRef(
            slug=image.slug,
            source_ref=image.source_ref,
            digest_sha256=image.digest_sha256,
            image_format=image.image_format,
            default_username=image.default_username or "ubuntu",
        )
        if image
        else None,
        ssh_keys=snap.ssh_keys,
        claim_ids=tuple(cid for cid, _ in claims),
        readiness_timeout_s=profile.readiness_timeout_s,
    )


@dataclass
class _Node:
    name: str
    os_disk: str
    net: Mapping[str, Any]
    running: dict[str, list[tuple[str, snapshots.SlotClaimSnapshot]]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )
    releasing: dict[str, list[tuple[str, snapshots.SlotClaimSnapshot]]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )
    slots: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    ingress: list[codec.IngressRule] = dataclasses.field(default_factory=list)


def build_many(
    conn: Connection, nodes: Iterable[str], *, pinned: tuple[str, ...] | None = None
) -> dict[str, codec.HostPlan]:
    """The plans `nodes` should run now, by name (unknown nodes are left out), from five queries in all."""
    names = sorted(set(nodes))
    if not names:
        return {}
    pins = pinned_images(conn) if pinned is None else pinned
    found, graceful, readiness = _inputs(conn, names)
    return {n.name: _plan(n, pins, graceful, readiness) for n in found}


def _inputs(conn: Connection, names: list[str]) -> tuple[list[_Node], int, int]:
    """The plan inputs of the known nodes among `names` (in name order) and the fleet's timeouts."""
    fleet = conn.execute("SELECT graceful_shutdown_timeout_s, readiness_timeout_s FROM fleet_settings").fetchone()
    graceful, readiness = fleet if fleet is not None else (None, None)
    by_id: dict[Any, _Node] = {
        node_id: _Node(str(name), str(os_disk), net)
        for node_id, name, os_disk, net in conn.execute(
            "SELECT id, name, os_disk, management_network FROM nodes WHERE name = ANY(%s)", (names,)
        )
    }
    ids = list(by_id)
    for node_id, cid, alloc, status, doc in conn.execute(
        "SELECT node_id, id, allocation_id, status, resource_snapshot FROM allocation_resource_claims"
        " WHERE node_id = ANY(%s) AND claim_kind = 'slot' AND status = ANY(%s)"
        " ORDER BY node_id, allocation_id, slot_index",
        (ids, list(_LIVE)),
    ):
        where = f"snapshot of claim {cid} ({alloc})"
        node = by_id[node_id]
        into = node.releasing if status == "releasing" else node.running
        into[str(alloc)].append((str(cid), snapshots.slot_claim_from_json(doc, where=where)))
    # The disk identity's fields come as columns: decoding 80,000 jsonb documents was most of reading them.
    # The range adds nothing to the answer; it tells the planner where the batch's slots are. Node ids
    # follow the order nodes were written (migration 0088), so a cold apply's batch of 1,000 nodes is one
    # narrow range of the (node_id, slot_index) index; with `= ANY` alone it planned a scan of every slot
    # row per batch (40-60 ms of the server's time each at 10,000 nodes, against 10 ms through the index).
    for row in conn.execute(
        "SELECT node_id, slot_index, gpu_pci_address, fabric_vf_pci_address, nvme_device, mac_address,"
        " host(private_ip) AS private_ip, numa_node, (nvme_identity ->> 'size_bytes')::numeric,"
        " nvme_identity ->> 'model', nvme_identity ->> 'serial', nvme_identity ->> 'wwid',"
        " nvme_identity ->> 'backing_file' FROM node_resource_slots"
        " WHERE node_id = ANY(%s) AND node_id BETWEEN %s AND %s AND present AND approved"
        " ORDER BY node_id, slot_index",
        (ids, min(ids, default=None), max(ids, default=None)),
    ).fetchall():
        by_id[row[0]].slots.append(row[1:])
    # The live public endpoints of the VMs each node runs (a releasing VM has none: its rules go first).
    for node_id, alloc, addr, port, ip, guest in conn.execute(
        "SELECT node_id, allocation_id, host(public_address), public_port, host(private_ip), guest_port"
        " FROM allocation_endpoints WHERE node_id = ANY(%s) AND freed_at IS NULL"
        " ORDER BY node_id, allocation_id, public_port",
        (ids,),
    ):
        node = by_id[node_id]
        if str(alloc) in node.running:
            node.ingress.append(codec.IngressRule(str(alloc), str(addr), int(port), str(ip), int(guest)))
    return (
        sorted(by_id.values(), key=lambda n: n.name),
        int(graceful or defaults.SHUTDOWN_TIMEOUT_S),
        int(readiness or defaults.READINESS_TIMEOUT_S),
    )


def _plan(node: _Node, pins: tuple[str, ...], graceful: int, readiness: int, *, slots: bool = True) -> codec.HostPlan:
    """The node's plan; without `slots`, its slots and disk identities are left out (`_spec` adds them)."""
    rows = node.slots if slots else ()
    net = node.net
    dhcp = net.get("dhcp_range", {})
    return codec.HostPlan(
        pinned_images=pins,
        node=node.name,
        generation=0,
        network=codec.Network(
            subnet=str(net["subnet"]),
            gateway=str(net["gateway"]),
            dhcp_start=str(dhcp.get("start", "")),
            dhcp_end=str(dhcp.get("end", "")),
            bridge=str(net.get("bridge", "gpuaasbr0")),
        ),
        os_disk=node.os_disk,
        shutdown_timeout_s=graceful,
        readiness_timeout_s=readiness,
        vms=tuple(_vm(a, c) for a, c in sorted(node.running.items())),
        releases=tuple(_vm(a, c) for a, c in sorted(node.releasing.items())),
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
            for i, g, vf, d, mac, ip, numa, *_ in rows
        ),
        disk_identities=tuple(
            codec.SlotIdentity(int(i), codec.DiskIdentity(int(size), model, serial, wwid, backing))
            for i, *_, size, model, serial, wwid, backing in rows
            if size is not None  # the column's domain: NULL, or an object with a numeric size_bytes
        ),
        ingress=tuple(node.ingress),
    )


def _spec(node: _Node, pins: tuple[str, ...], graceful: int, readiness: int) -> dict[str, Any]:
    """`codec.to_json(_plan(node, ...))`, its slot parts made straight from the slot rows.

    A cold apply writes a plan for every node, eight slots and disk identities
    each: three frozen dataclasses per slot, then read back field by field, were
    most of its cost. The rest of the plan (network, VMs, releases, ingress)
    still goes through the codec; a test holds the two equal.
    """
    doc = codec.to_json(_plan(node, pins, graceful, readiness, slots=False))
    doc["slots"] = [
        {
            "slot_index": int(i),
            "gpu_pci_address": str(g),
            "fabric_vf_pci_address": vf,
            "nvme_device": str(d),
            "mac_address": str(mac),
            "private_ip": str(ip),
            "numa_node": int(numa),
        }
        for i, g, vf, d, mac, ip, numa, *_ in node.slots
    ]
    identities = [
        {"slot_index": int(i), "nvme_identity": _identity(int(size), model, serial, wwid, backing)}
        for i, *_, size, model, serial, wwid, backing in node.slots
        if size is not None  # as `_plan`: NULL, or an object with a numeric size_bytes
    ]
    if identities:  # last, as `codec.to_json` puts it
        doc["disk_identities"] = identities
    return doc


def _identity(size: int, model: Any, serial: Any, wwid: Any, backing: Any) -> dict[str, Any]:
    """`codec.DiskIdentity(size, model, serial, wwid, backing).as_dict()`, without the instance."""
    out: dict[str, Any] = {"size_bytes": size}
    for name, value in (("model", model), ("serial", serial), ("wwid", wwid), ("backing_file", backing)):
        if value is not None:
            out[name] = value
    return out


def build(conn: Connection, node: str, generation: int = 0) -> codec.HostPlan | None:
    """The plan `node` should run now (None when the node is unknown)."""
    plan = build_many(conn, [node]).get(node)
    return dataclasses.replace(plan, generation=generation) if plan is not None and generation else plan


def pinned_images(conn: Connection) -> tuple[str, ...]:
    """Digests of the images the catalog pins in every host's cache (`Image.cache_pinned`)."""
    rows = conn.execute(
        "SELECT digest_sha256 FROM os_images WHERE present AND cache_pinned AND digest_sha256 IS NOT NULL ORDER BY 1"
    ).fetchall()
    return tuple(str(r[0]) for r in rows)


def write_one(conn: Connection, node: str, *, revision: str | None = None) -> Written | None:
    """Rebuild one node's plan; bump the generation only if the spec changed."""
    written = write(conn, [node], revision=revision)
    return written[0] if written else None


def write(
    conn: Connection,
    nodes: Iterable[str] | None = None,
    *,
    revision: str | None = None,
    shown: progress.Phase | None = None,
    connect: Callable[[], Connection] | None = None,
) -> list[Written]:
    """Rebuild the plans of `nodes` (default: every present node and every node holding claims).

    Built and stored as sets, BATCH nodes per transaction: their advisory
    locks taken in name order, then their inputs read in bulk (after the
    locks, so a plan is never built from older claims than one a concurrent
    writer stored), then one upsert (`store`). `shown` (a progress phase)
    gets the node count and advances per batch. With `connect`, many batches
    alternate between `conn` and a second session (`_alternating`).
    """
    if nodes is None:
        with dberrors.wrapped("list nodes for host plans"):
            rows = conn.execute(
                "SELECT name FROM nodes n WHERE present OR EXISTS (SELECT 1 FROM allocation_resource_claims c"
                " WHERE c.node_id = n.id AND c.status IN ('reserved', 'provisioning', 'active', 'releasing'))"
                " ORDER BY name"
            ).fetchall()
        nodes = [str(r[0]) for r in rows]
    todo = sorted(set(nodes))
    if shown is not None:
        shown.total = len(todo)
    batches = [todo[at : at + BATCH] for at in range(0, len(todo), BATCH)]
    if connect is not None and len(batches) > 1:
        return _alternating(conn, connect, batches, revision, shown)
    out: list[Written] = []
    pins: tuple[str, ...] | None = None
    for batch in batches:
        if pins is None:
            with dberrors.wrapped("read the pinned images"):
                pins = pinned_images(conn)
        out += _write_batch(conn, batch, pins, revision)
        if shown is not None:
            shown.advance(len(batch))
    return out


def _write_batch(conn: Connection, batch: list[str], pins: tuple[str, ...], revision: str | None) -> list[Written]:
    """One batch in one transaction: its locks, its inputs read after them, its plans stored."""
    with dberrors.wrapped(f"write the host plans of {len(batch)} node(s) from {batch[0]}"), conn.transaction():
        _lock(conn, batch)
        have = _generations(conn, batch)
        if not have and len(batch) >= COPY_FROM:  # a cold batch: documents straight from the rows
            found, graceful, readiness = _inputs(conn, batch)
            return _copy_new(conn, ((n.name, _spec(n, pins, graceful, readiness)) for n in found), revision)
        plans = build_many(conn, batch, pinned=pins)
        return _upsert(conn, list(plans.values()), revision, have)


def _alternating(
    conn: Connection,
    connect: Callable[[], Connection],
    batches: list[list[str]],
    revision: str | None,
    shown: progress.Phase | None,
) -> list[Written]:
    """`write`'s batches, the even ones on `conn` here, the odd ones on a second session in a thread.

    Each batch is still one transaction with its own locks (disjoint sets, each taken in one sorted
    statement: the two never wait on each other). A cold batch waits on the server about half its time;
    the other's specs are built meanwhile. A failure stops both sides after their current batch and is
    raised; batches written before it stay, as one after the other.
    """
    with dberrors.wrapped("read the pinned images"):
        pins = pinned_images(conn)
    results: list[list[Written] | None] = [None] * len(batches)
    failed = threading.Event()
    counted = threading.Lock()

    def run(c: Connection, mine: range) -> None:
        try:
            for i in mine:
                if failed.is_set():
                    return
                results[i] = _write_batch(c, batches[i], pins, revision)
                if shown is not None:
                    with counted:
                        shown.advance(len(batches[i]))
        except BaseException:
            failed.set()
            raise

    with dberrors.wrapped("open a second session for host plans"):
        other = connect()
    try:
        with futures.ThreadPoolExecutor(1, thread_name_prefix="gpuaas-hostplans") as pool:
            odd = pool.submit(run, other, range(1, len(batches), 2))
            try:
                run(conn, range(0, len(batches), 2))
            finally:
                error = odd.exception()  # waits for the other side: never left writing behind us
        if error is not None:
            raise error
    finally:
        other.close()
    return [w for part in results if part is not None for w in part]


def store(conn: Connection, plans: Iterable[codec.HostPlan], *, revision: str | None = None) -> list[Written]:
    """Store plans built elsewhere (the demo's restamped plans, tests' lab plans) the way `write` stores its own.

    The one writer of `host_plans`: the generation is the stored one, moved up
    by one only where the spec (all but the generation) changed; the plan's
    own `generation` is ignored.
    """
    todo = sorted(plans, key=lambda p: p.node)
    out: list[Written] = []
    for at in range(0, len(todo), BATCH):
        batch = todo[at : at + BATCH]
        with dberrors.wrapped(f"store the host plans of {len(batch)} node(s)"), conn.transaction():
            _lock(conn, [p.node for p in batch])
            out += _upsert(conn, batch, revision)
    return out


def _lock(conn: Connection, nodes: list[str]) -> None:
    """Every node's advisory lock, in one statement and in name order (two writers never deadlock)."""
    conn.execute(_LOCK, (sorted(nodes),))


_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS host_plan_stage (node_name text PRIMARY KEY, spec jsonb NOT NULL)"
    " ON COMMIT DELETE ROWS"
)
# One statement for the batch: new nodes get generation 1, a changed spec the stored generation + 1
# (in the row and in the spec's own "generation"), an unchanged one is not touched (no row version,
# no NOTIFY to the host's long poll). {source} yields (node_name, spec).
_UPSERT = (
    "INSERT INTO host_plans AS h (node_name, generation, spec, revision)"
    " SELECT s.node_name, 1, jsonb_set(s.spec, '{{generation}}', '1'), %(revision)s FROM {source}"
    " ON CONFLICT (node_name) DO UPDATE SET generation = h.generation + 1,"
    " spec = jsonb_set(EXCLUDED.spec, '{{generation}}', to_jsonb(h.generation + 1)),"
    " revision = EXCLUDED.revision, updated_at = now()"
    " WHERE h.spec - 'generation' IS DISTINCT FROM EXCLUDED.spec - 'generation'"
    " RETURNING node_name, generation"
)
_FROM_STAGE = _UPSERT.format(source="host_plan_stage s")
_FROM_ARRAYS = _UPSERT.format(
    source="(SELECT n, j::jsonb FROM unnest(%(nodes)s::text[], %(specs)s::text[]) AS u (n, j)) AS s (node_name, spec)"
)
COPY_FROM = 100  # plans staged by COPY from this many on; fewer (a commit's few nodes) go as two arrays


def _generations(conn: Connection, names: list[str]) -> dict[str, int]:
    """The stored generation of each of `names` that has a plan."""
    return {
        str(n): int(g)
        for n, g in conn.execute("SELECT node_name, generation FROM host_plans WHERE node_name = ANY(%s)", (names,))
    }


def _upsert(
    conn: Connection, plans: list[codec.HostPlan], revision: str | None, have: dict[str, int] | None = None
) -> list[Written]:
    """Stage the batch's specs (COPY, or arrays for a few), then one upsert that changes only changed specs.

    `have`: the stored generations of these nodes, when the caller read them.
    A large batch of nodes that have no plan yet skips the staging (`_copy_new`)."""
    if not plans:
        return []
    names = [p.node for p in plans]
    if have is None:
        have = _generations(conn, names)
    if not have and len(plans) >= COPY_FROM:
        return _copy_new(conn, ((p.node, codec.to_json(_unstamped(p))) for p in plans), revision)
    specs = [_text(codec.to_json(_unstamped(plan))) for plan in plans]
    if len(plans) < COPY_FROM:
        rows = conn.execute(_FROM_ARRAYS, {"revision": revision, "nodes": names, "specs": specs})
        changed = {str(n): int(g) for n, g in rows}
    else:
        conn.execute(_STAGE)
        with conn.cursor().copy("COPY host_plan_stage (node_name, spec) FROM STDIN") as copy:
            for name, spec in zip(names, specs, strict=True):
                copy.write_row((name, spec))
        changed = {str(n): int(g) for n, g in conn.execute(_FROM_STAGE, {"revision": revision})}
        conn.execute("DELETE FROM host_plan_stage")  # inside an outer transaction, ON COMMIT comes later
    return [Written(n, changed[n], changed=True) if n in changed else Written(n, have[n], changed=False) for n in names]


def _copy_new(conn: Connection, specs: Iterable[tuple[str, dict[str, Any]]], revision: str | None) -> list[Written]:
    """Nodes none of which has a plan yet (a cold apply): their specs COPYed straight into the table, generation 1.

    The batch's advisory locks are held and no row of its nodes exists, so no
    other writer can add one meanwhile: the upsert's staging, comparison and
    re-stamping have nothing to do. The stored spec is the one the upsert
    stores. `specs`: (node, `codec.to_json` of its unstamped plan), built as
    the COPY streams.
    """
    out: list[Written] = []
    with conn.cursor().copy("COPY host_plans (node_name, generation, spec, revision) FROM STDIN") as copy:
        for node, doc in specs:
            doc["generation"] = 1
            copy.write_row((node, 1, _text(doc), revision))
            out.append(Written(node, 1, changed=True))
    return out


def _text(doc: dict[str, Any]) -> str:
    """A spec as the JSON text the server reads into jsonb: no blanks (less to make and to parse, same jsonb)."""
    return json.dumps(doc, separators=(",", ":"))


def _unstamped(plan: codec.HostPlan) -> codec.HostPlan:
    """The spec as compared and stored before the upsert stamps its generation (built plans already have 0)."""
    return plan if plan.generation == 0 else dataclasses.replace(plan, generation=0)


def read(conn: Connection, node: str) -> codec.HostPlan | None:
    """The stored plan of a node, decoded (what a host reconciler reads)."""
    with dberrors.wrapped(f"read host plan of {node}"):
        row = conn.execute("SELECT spec FROM host_plans WHERE node_name = %s", (node,)).fetchone()
    return codec.from_json(row[0]) if row else None
