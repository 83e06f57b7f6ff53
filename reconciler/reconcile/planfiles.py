"""Saved plans: `gpuaas plan --out FILE` writes one, `gpuaas apply FILE` applies exactly it.

As with `terraform plan -out` / `terraform apply PLANFILE`, a reviewer
approves a file, not a moving target. The file is one JSON document:

- `format` ("gpuaas.io/plan") and `version` (1): anything else is refused
  (`apply.plan_version`), never guessed at;
- `repo` (absolute path planned in), `base_revision`, `head_revision` (a
  commit, or `tree:<hash>` for a directory outside git), `policy`;
- `desired_hash`: the content hash of head's typed documents (the hash the
  inventory sync records), so the exact desired state is pinned, not just a
  name for it;
- `observed_digest`: sha256 over what the plan was computed against in the
  database: live claims, slot states, host facts (firmware, health), the
  allocations already placed, and the inventory generation (bumped by every
  inventory write);
- `plan`: the whole PR plan (`prplan_render.as_dict`: inventory changes,
  slots, nodes, placements, pending, releases, capacity), `host_plans` (the
  nodes whose host plan the apply rebuilds, and why) and `decisions` with
  its digest: the placements (node, slots, VM profile), releases and the set
  of allocations left pending.

`gpuaas apply FILE` reads head again at `head_revision` and refuses with
`apply.plan_stale` when its content hash differs, when the database digest
differs (a claim, slot state, host fact or inventory row moved), or when,
inside the reconciliation, the planner decides anything else than the saved
decisions (a writer raced the check): nothing is then placed or released.
An offline plan (`--offline`, computed without the database) or an invalid
one is never applied (`apply.plan_offline`, `apply.plan_invalid`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import codes as reconciler_codes
from reconciler import plans, sources
from reconciler.placement import prplan, prplan_render
from schemas.errors import PermanentError

if TYPE_CHECKING:
    from desired.state import Delta, DesiredState, LoadResult
    from reconciler.store.connections import Connection

FORMAT = "gpuaas.io/plan"
VERSION = 1
MAX_BYTES = 64 * 1024 * 1024

Planner = plans.Planner


@dataclass(frozen=True, slots=True)
class SavedPlan:
    """The parts of a plan file apply checks and enforces."""

    path: str
    repo: str
    head_revision: str
    base_revision: str | None
    desired_hash: str
    observed_digest: str
    decisions: Mapping[str, Any]
    decisions_digest: str
    policy: str | None
    offline: bool
    valid: bool


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


# ------------------------------------------------------------------ digests (pure)


def observed_digest(observed: plans.Observed, inventory_generation: int) -> str:
    """sha256 of everything in the database a plan depends on besides git."""
    doc: dict[str, Any] = {
        "claims": sorted(
            [
                c.allocation_id,
                c.node,
                c.kind.value,
                c.slot_index if c.slot_index is not None else -1,
                c.status.value,
                c.tenant,
            ]
            for c in observed.claims
        ),
        "slot_status": sorted([n, i, s.value] for (n, i), s in observed.slot_status.items()),
        "firmware_ready": sorted([n, bool(v)] for n, v in observed.firmware_ready.items()),
        "unavailable_nodes": sorted(observed.unavailable_nodes),
        "placed": sorted(observed.placed),
        "inventory_generation": inventory_generation,
    }
    # Host drift blocks slots and nodes; keys only when present, so a clean fleet's digest is unchanged.
    if observed.slot_blocks:
        doc["slot_blocks"] = sorted([n, i, list(c)] for (n, i), c in observed.slot_blocks.items())
    if observed.corrupt_nodes:
        doc["corrupt_nodes"] = sorted([n, list(c)] for n, c in observed.corrupt_nodes.items())
    return _digest(doc)


def decisions(plan: plans.Plan) -> dict[str, Any]:
    """What apply writes, canonical: placements and releases exactly, and who stays pending."""
    return {
        "placements": sorted(
            (
                {
                    "allocation_id": x.allocation_id,
                    "node": x.node,
                    "slot_indexes": list(x.slot_indexes),
                    "claim_kind": x.claim_kind.value,
                    "vm_profile": x.profile.name if x.profile else None,
                    "image": x.image,
                }
                for x in plan.placements
            ),
            key=lambda d: str(d["allocation_id"]),
        ),
        "releases": sorted(
            (
                {"allocation_id": r.allocation_id, "node": r.node, "slot_indexes": list(r.slot_indexes)}
                for r in plan.releases
            ),
            key=lambda d: str(d["allocation_id"]),
        ),
        "pending": sorted(x.allocation_id for x in plan.pending),
    }


def host_plan_changes(pr: prplan.PrPlan) -> list[dict[str, Any]]:
    """Nodes whose host plan applying `pr` rebuilds, each with why (placed, released, inventory)."""
    why: dict[str, set[str]] = {}
    for x in pr.plan.placements:
        why.setdefault(x.node, set()).add(f"place {x.allocation_id}")
    for r in pr.plan.releases:
        why.setdefault(r.node, set()).add(f"release {r.allocation_id}")
    for c in pr.inventory.changes:
        if c.kind in ("Node", "SlotMap"):
            why.setdefault(c.name, set()).add(f"{c.kind} {c.action}")
    fleet = [c for c in pr.inventory.changes if c.kind == "Fleet"]
    out = [{"node": node, "why": sorted(reasons)} for node, reasons in sorted(why.items())]
    if fleet:
        out.insert(0, {"node": "*", "why": [f"Fleet {fleet[0].action}: every node's plan is rebuilt"]})
    return out


# ------------------------------------------------------------------ the document


def document(
    pr: prplan.PrPlan,
    *,
    repo: Path,
    head_revision: str,
    desired_hash: str,
    observed: str,
    policy: str | None,
    created_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """The plan file's content (plain JSON data)."""
    chosen = decisions(pr.plan)
    return {
        "format": FORMAT,
        "version": VERSION,
        "created_at": (created_at or dt.datetime.now(dt.UTC)).isoformat(),
        "repo": str(repo.resolve()),
        "base_revision": pr.base_revision,
        "head_revision": head_revision,
        "desired_hash": desired_hash,
        "observed_digest": observed,
        "policy": policy,
        "offline": pr.offline,
        "valid": pr.valid,
        "decisions": chosen,
        "decisions_digest": _digest(chosen),
        "host_plans": host_plan_changes(pr),
        "plan": prplan_render.as_dict(pr),
    }


def write(path: Path, doc: Mapping[str, Any]) -> None:
    """Write atomically (a reader never sees half a plan), readable by the group like any build output."""
    text = json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"
    directory = path.resolve().parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    except OSError as e:
        raise PermanentError(
            f"{path}: cannot write the plan file: {e.strerror}", code=reconciler_codes.PLAN_OUT_UNWRITABLE
        ) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise PermanentError(
            f"{path}: cannot write the plan file: {e.strerror}", code=reconciler_codes.PLAN_OUT_UNWRITABLE
        ) from e


def _need(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind):
        raise PermanentError(
            f"{path}: field {key!r} is missing or malformed; not a plan file gpuaas wrote",
            code=reconciler_codes.APPLY_PLAN_UNREADABLE,
        )
    return value


def read(path: Path) -> SavedPlan:
    """The saved plan at `path`; apply.plan_unreadable or apply.plan_version when it is not one we can apply."""
    from schemas import inputfiles

    raw = inputfiles.read_bytes(path, limit=MAX_BYTES, code=reconciler_codes.APPLY_PLAN_UNREADABLE, what="plan file")
    try:
        doc = json.loads(raw)
    except ValueError as e:  # also UnicodeDecodeError and json.JSONDecodeError
        raise PermanentError(
            f"{path}: not a plan file (a JSON document written by `gpuaas plan --out`)",
            code=reconciler_codes.APPLY_PLAN_UNREADABLE,
        ) from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PermanentError(
            f'{path}: not a plan file (no "format": "{FORMAT}")', code=reconciler_codes.APPLY_PLAN_UNREADABLE
        )
    if doc.get("version") != VERSION:
        raise PermanentError(
            f"{path}: plan file version {doc.get('version')!r}; this gpuaas applies version {VERSION} only: plan again",
            code=reconciler_codes.APPLY_PLAN_VERSION,
        )
    saved = SavedPlan(
        path=str(path),
        repo=_need(doc, "repo", str, path),
        head_revision=_need(doc, "head_revision", str, path),
        base_revision=doc.get("base_revision") if isinstance(doc.get("base_revision"), str) else None,
        desired_hash=_need(doc, "desired_hash", str, path),
        observed_digest=_need(doc, "observed_digest", str, path),
        decisions=_need(doc, "decisions", dict, path),
        decisions_digest=_need(doc, "decisions_digest", str, path),
        policy=doc.get("policy") if isinstance(doc.get("policy"), str) else None,
        offline=_need(doc, "offline", bool, path),
        valid=_need(doc, "valid", bool, path),
    )
    if _digest(saved.decisions) != saved.decisions_digest:
        raise PermanentError(
            f"{path}: the decisions do not match their digest (the file was edited); plan again",
            code=reconciler_codes.APPLY_PLAN_UNREADABLE,
        )
    if not saved.valid:
        raise PermanentError(
            f"{path}: the planned head was invalid; nothing to apply", code=reconciler_codes.APPLY_PLAN_INVALID
        )
    if saved.offline:
        raise PermanentError(
            f"{path}: an --offline plan was computed without the database and cannot be applied; "
            "plan against the database to save a plan for apply",
            code=reconciler_codes.APPLY_PLAN_OFFLINE,
        )
    return saved


# ------------------------------------------------------------------ apply's checks


def load_head(saved: SavedPlan, repo: Path) -> LoadResult:
    """Head as planned: the commit, or (tree:<hash>) the directory, read again."""
    if saved.head_revision.startswith("tree:"):
        loaded = sources.load(repo)
        loaded.state.revision = None
        return loaded
    return sources.load(repo, saved.head_revision)


def check_desired(saved: SavedPlan, desired_hash: str) -> None:
    if desired_hash != saved.desired_hash:
        raise PermanentError(
            f"the desired state at {saved.head_revision} is not what {saved.path} was planned from (content "
            f"{desired_hash[:12]}, planned {saved.desired_hash[:12]}); plan again",
            code=reconciler_codes.APPLY_PLAN_STALE,
        )


def check_database(saved: SavedPlan, digest: str) -> None:
    if digest != saved.observed_digest:
        raise PermanentError(
            f"the database moved since {saved.path} was planned (claims, slot states, host facts or inventory "
            "changed); nothing applied: plan again",
            code=reconciler_codes.APPLY_PLAN_STALE,
        )


def database_digest(conn: Connection) -> str:
    """observed_digest of the database behind `conn` (an empty fleet before the first migration)."""
    from reconciler.store import live, migrations, views

    if not migrations.applied(conn):
        return observed_digest(plans.Observed(), 0)
    return observed_digest(live.observe(conn), views.inventory_generation(conn))


def guarded_planner(saved: SavedPlan) -> Planner:
    """The planner apply runs: refuses (apply.plan_stale) to go on with any decision but the saved ones."""
    from reconciler.placement import planner

    def plan(desired: DesiredState, observed: plans.Observed, delta: Delta | None = None, /) -> plans.Plan:
        out = planner.plan(desired, observed, policy=saved.policy)
        if _digest(decisions(out)) != saved.decisions_digest:
            raise PermanentError(
                f"the planner now decides otherwise than {saved.path} (the database moved while applying); "
                "nothing placed or released: plan again",
                code=reconciler_codes.APPLY_PLAN_STALE,
            )
        return out

    return plan
