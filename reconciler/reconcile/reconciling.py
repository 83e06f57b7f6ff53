"""`reconcile(conn, state, policy=...)`: one reconciliation of a desired-state revision.

sync inventory -> absorb host reports -> observe -> plan (pure) -> apply ->
write host plans -> record the run in history. This is what `gpuaas apply`
runs once and what the watch loop runs for every new revision. Several
reconcilers may run it at once against one database: syncs serialise on an
advisory lock, placements on the allocation row, and a revision applied
twice changes nothing the second time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from desired import defaults
from desired import problems as p
from desired.reading import loading
from desired.state import Delta, DesiredState
from policies import immutables
from reconciler import codes as reconciler_codes
from reconciler.placement import planner as planning
from reconciler.plans import Observed, Plan, Planner
from reconciler.providers import protocols as provider_protocols
from reconciler.providers.registry import Providers
from reconciler.reconcile import leasing
from reconciler.store import (
    claims,
    cleanup,
    deadlines,
    history,
    hostplans,
    inventory,
    inventoryrows,
    lifecycle,
    live,
    revisions,
)
from reconciler.store.connections import Connection
from schemas import dberrors, progress
from schemas.errors import GpuaasError, PermanentError


class Invalid(PermanentError):
    """The revision breaks a rule that needs the store to check (an edit of a held allocation).

    Refused like a revision that fails validation: recorded once in history
    with every problem, nothing written, the last valid revision stays in force.
    """

    def __init__(self, problems: list[p.Problem]) -> None:
        first = problems[0]
        super().__init__(
            f"{len(problems)} problem(s) against the store, first: {first.render()}; nothing applied", code=first.code
        )
        self.problems = problems
        self.run_id: int | None = None  # the history row that records the refusal


@dataclass(frozen=True, slots=True)
class ReconcileResult:
    run_id: int
    revision: str
    sync: inventory.SyncResult
    absorbed: cleanup.AbsorbResult
    plan: Plan
    applied: claims.ApplyResult
    host_plans: tuple[hostplans.Written, ...]
    rescheduled: tuple[lifecycle.Rescheduled, ...] = ()
    expired: tuple[deadlines.Expired, ...] = ()  # pending past the deadline: failed, sku_unavailable
    leases: leasing.StepResult | None = None

    @property
    def changed(self) -> bool:
        return (
            self.sync.changed
            or self.absorbed.changed
            or self.applied.changed
            or (self.leases is not None and self.leases.changed)
            or any(w.changed for w in self.host_plans)
            or any(r.outcome in ("rescheduled", "failed") for r in self.rescheduled)
            or bool(self.expired)
        )

    def counts(self) -> dict[str, int]:
        a = self.applied
        return {
            "inventory_changes": len(self.sync.changes),
            "placed": len(a.placed),
            "pending": len(
                {p.allocation_id for p in a.pending} | {p.allocation_id for p in a.placements if not p.placed}
            ),
            "releasing": sum(1 for r in a.releases if r.outcome == "releasing"),
            "cancelled": len(a.cancelled) + sum(1 for r in a.releases if r.outcome == "cancelled"),
            "conflicts_retried": a.conflicts_retried,
            "slots_freed": sum(1 for f in self.absorbed.freed if f.outcome == "freed"),
            "claims_moved": self.absorbed.moved,
            "host_plans_written": sum(1 for w in self.host_plans if w.changed),
            "rescheduled": sum(1 for r in self.rescheduled if r.outcome == "rescheduled"),
            "provision_failed": sum(1 for r in self.rescheduled if r.outcome == "failed"),
            "deadline_failed": len(self.expired),
            "leases_moved": len(self.leases.moved) if self.leases else 0,
        }


def planner_for(policy: str | None = None) -> Planner:
    """The pure planner with a packing policy fixed (None: the fleet's `placement.policy`).

    Cold: a fresh placement engine per call (`gpuaas apply`, `plan`). The watch
    loop (`gpuaas run`) passes `replanning.WarmPlanner(policy)` instead, which
    keeps the engine between revisions and gives the same plans.
    """

    def run(desired: DesiredState, observed: Observed, delta: Delta | None = None, /) -> Plan:
        return planning.plan(desired, observed, policy=policy)

    return run


def max_claim_attempts(state: DesiredState) -> int:
    return state.fleet.placement.max_claim_attempts if state.fleet else defaults.CLAIM_CANDIDATES


# No cyclic collection while a revision is applied: a cold apply builds rows and plans for every node
# beside the whole tree, and the collector walking them was half its CPU at 10,000 nodes.
@loading.collector_paused()
def reconcile(
    conn: Connection,
    state: DesiredState,
    *,
    policy: str | None = None,
    source: str = "",
    planner: Planner | None = None,
    fault: claims.Fault | None = None,
    memory: inventory.Memory | None = None,
    observed: live.Memory | None = None,
    shown: progress.Progress | None = None,
    providers: Providers | None = None,
    probe: provider_protocols.SshProbe | None = None,
    lease_fault: leasing.Fault | None = None,
    delta: Delta | None = None,
    connect: Callable[[], Connection] | None = None,
    checked: Callable[[], object] | None = None,
) -> ReconcileResult:
    """Bring the store to `state`; every step is recorded in one history row.

    `planner` replaces the pure planner (a saved plan's guard, tests); otherwise
    `policy` picks the packing policy. `shown` reports each step as a phase
    (`gpuaas apply` on a terminal: a cold apply of 10,000 nodes runs minutes).
    Baremetal leases on nodes that declare a machine provider are moved through
    `providers` (default: built from the Fleet, credentials read at run time)
    after the placements. `delta`: how the reader built `state` from the
    revision before it, when it did (the watch loop): the inventory sync and
    a warm planner work from the change. `observed`: the loop's last observed
    state, refreshed by what changed since (`store.observing`). `connect`
    opens a second session for a write of many host plans (a cold apply's):
    its batches then alternate between the two (`hostplans.write`).
    `checked` runs inside the inventory sync's transaction before it commits
    (and after a failed sync): it raises `Invalid` when `state` breaks a
    cross-file rule, so nothing is written; the watch loop runs the rules
    of its first revision meanwhile.
    """
    shown = shown or progress.Progress(style="off")
    planner = planner or planner_for(policy)
    revision = inventoryrows.revision_key(state)
    run_id = history.start(conn, revision=revision, source=source)
    try:
        pins = hostplans.pinned_images(conn)
        with shown.phase("sync inventory", unit="rows") as ph:
            try:
                synced = inventory.sync(
                    conn,
                    state,
                    memory=memory,
                    guard=partial(refuse_edits, conn, state),
                    delta=delta,
                    shown=ph,
                    before_commit=checked,
                )
            except Invalid:
                raise
            except Exception:
                if checked is not None:
                    checked()  # rows of a tree that breaks the rules may not build: then its problems are the answer
                raise
        with shown.phase("absorb host reports"):
            absorbed = cleanup.absorb(conn)
            lifecycle.sync_settings(conn, state)
            moved = lifecycle.reschedule(conn, max_provision_attempts=lifecycle.fleet_settings(state)[1])
        with shown.phase("plan"):
            plan = planner(state, live.observe(conn, observed), delta)
        with shown.phase("write claims"):
            applied = claims.apply(
                conn, plan, revision=synced.revision, max_claim_attempts=max_claim_attempts(state), fault=fault
            )
            expired = deadlines.expire(conn, state)  # what is still pending after this pass may be past its deadline
        touched: list[str] | None = None  # None: every node's plan is rebuilt (a fleet-wide change)
        # The fleet settings and the catalog's image pins are in every host plan.
        if not any(c.kind == "fleet" for c in synced.changes) and hostplans.pinned_images(conn) == pins:
            touched = sorted(
                set(claims.placed_nodes(applied))
                | set(absorbed.nodes)
                | _unplanned(conn, None if synced.full else inventory.added_nodes(synced.changes))
                | inventory.changed_nodes(synced.changes)
                | {r.node for r in moved if r.node}
            )
        with shown.phase("write host plans", unit="nodes") as ph:
            written = tuple(hostplans.write(conn, touched, revision=synced.revision, shown=ph, connect=connect))
        leased = None
        if _declares_machines(state, delta) or providers is not None:
            leased = leasing.step(conn, state, providers or Providers.of(state), probe=probe, fault=lease_fault)
    except Invalid as e:  # refused like invalid YAML: recorded once, with every problem; nothing was written
        e.run_id = run_id
        finish_refused(conn, run_id, e.problems)
        raise
    except GpuaasError as e:
        _doubt(memory, observed)
        history.finish(conn, run_id, result="error", problems=[{"code": e.code, "message": e.message}])
        raise
    except Exception as e:  # a bug: still leave a finished history row behind, then surface it
        _doubt(memory, observed)
        history.finish(
            conn, run_id, result="error", problems=[{"code": reconciler_codes.GPUAAS_BUG, "message": repr(e)}]
        )
        raise
    result = ReconcileResult(run_id, synced.revision, synced, absorbed, plan, applied, written, moved, expired, leased)
    history.finish(conn, run_id, result="changed" if result.changed else "unchanged", counts=result.counts())
    return result


def refuse_edits(
    conn: Connection, state: DesiredState, changes: Sequence[inventory.RowChange], allocations: set[str] | None
) -> None:
    """Raise `Invalid` when `state` edits an allocation that holds claims (`policies.immutables`).

    The sync's guard, inside its transaction and before the allocation rows
    are written: it reads back only the allocations the sync compares (with
    a delta, those this revision changed; None: all) and those of a SKU
    whose row changed, so in the loop it costs what the change costs.
    """
    skus = {c.key for c in changes if c.kind == "sku" and c.action == "changed"}
    if allocations is not None and not allocations and not skus:
        return
    held = live.held(conn) if allocations is None else live.held(conn, ids=allocations, skus=skus)
    problems = immutables.check(state, held)
    if problems:
        raise Invalid(problems)


# The last state asked about and its answer: a revision that changed no Node document has the same
# answer as the state it was read from, without a walk over every node per commit.
_machines_seen: tuple[weakref.ref[DesiredState], bool] | None = None


def _declares_machines(state: DesiredState, delta: Delta | None) -> bool:
    """Whether any node declares a machine provider (baremetal leases are then moved)."""
    global _machines_seen  # noqa: PLW0603 (a one-entry memo, keyed by the state object itself)
    seen = _machines_seen
    if seen is not None and seen[0]() is state:
        return seen[1]
    base = delta.base() if delta is not None and "Node" not in delta.kinds() else None
    if seen is not None and base is not None and base is seen[0]():
        found = seen[1]
    else:
        found = any(n.machine is not None for n in state.nodes.values())
    _machines_seen = (weakref.ref(state), found)
    return found


def _doubt(memory: inventory.Memory | None, observed: live.Memory | None = None) -> None:
    """A step failed after the sync committed: the next sync compares every row (and so every node is
    checked for a missing host plan again, not only the ones it adds), and the next observe reads all."""
    if memory is not None:
        memory.generation = None
    if observed is not None:
        observed.forget()


def _unplanned(conn: Connection, among: set[str] | None) -> set[str]:
    """Present nodes that have no host plan yet (first apply after they were added).

    `among`: only these may lack one (the nodes a trusted sync added or restored); None: every node.
    """
    if among is not None and not among:
        return set()
    with dberrors.wrapped("list nodes without a host plan"):
        rows = conn.execute(
            "SELECT n.name FROM nodes n LEFT JOIN host_plans h ON h.node_name = n.name"
            " WHERE n.present AND h.node_name IS NULL AND (%(all)s OR n.name = ANY(%(among)s))",
            {"all": among is None, "among": sorted(among or ())},
        ).fetchall()
    return {str(r[0]) for r in rows}


def summary(result: ReconcileResult) -> dict[str, Any]:
    """Plain data for `-o json` and for the history of the gitops loop."""
    a = result.applied
    return {
        "revision": result.revision,
        "changed": result.changed,
        "counts": result.counts(),
        "inventory": [c.render() for c in result.sync.changes],
        "placements": [
            {
                "allocation_id": p.allocation_id,
                "node": p.node,
                "slot_indexes": list(p.slot_indexes),
                "claim_ids": list(p.claim_ids),
                "attempts": len(p.attempts),
                "conflicts": p.conflicts,
            }
            for p in a.placed
        ],
        "pending": (
            [{"allocation_id": p.allocation_id, "code": p.code, "message": p.message} for p in a.pending]
            + [
                {
                    "allocation_id": p.allocation_id,
                    "code": p.pending_code or f"claim.{p.outcome.value}",
                    "message": p.pending_message or (p.attempts[-1].detail if p.attempts else ""),
                }
                for p in a.placements
                if not p.placed
            ]
        ),
        "releases": [
            {
                "allocation_id": r.allocation_id,
                "outcome": r.outcome,
                "node": r.node,
                "slot_indexes": list(r.slot_indexes),
            }
            for r in a.releases
        ],
        "cancelled": list(a.cancelled),
        "freed": [
            {"node": f.node, "slot_index": f.slot_index, "allocation_id": f.allocation_id, "outcome": f.outcome}
            for f in result.absorbed.freed
        ],
        "host_plans": [{"node": w.node, "generation": w.generation} for w in result.host_plans if w.changed],
        "rescheduled": [
            {
                "allocation_id": r.allocation_id,
                "outcome": r.outcome,
                "node": r.node,
                "attempt": r.attempt,
                "code": r.code,
            }
            for r in result.rescheduled
            if r.outcome in ("rescheduled", "failed")
        ],
        "expired": [
            {
                "allocation_id": e.allocation_id,
                "code": "sku_unavailable",
                "deadline_s": e.deadline_s,
                "pending_code": e.pending_code,
            }
            for e in result.expired
        ],
    }


def finish_refused(conn: Connection, run_id: int, problems: Sequence[p.Problem]) -> None:
    """End history row `run_id` as a refused revision: an error with every problem, rendered as printed."""
    history.finish(
        conn,
        run_id,
        result="error",
        counts={revisions.INVALID_COUNT: len(problems)},
        problems=[{**x.as_dict(), "text": x.render()} for x in problems],
    )
