"""`gpuaas plan [PATH] [--base REV] [--head REV] [-o text|markdown|json|yaml] [--offline] [--out FILE]`.

Exit-code flags: `[--detailed-exitcode] [--fail-on-pending]`.

What merging head would do. Head is `--head` (default HEAD; a directory
outside git is read as it is). Against the database (default): claims and
slot states come from the store, and the base is `--base`, else the revision
the database last reconciled when this repo has it, else the inventory the
database holds. With `--offline` (CI, no database): the base is `--base`
(default: nothing) planned from no claims, and its placements are the
claims head is planned against.

Exit status: 1 on an error (head invalid: every FILE:LINE is printed and
nothing is planned). With --detailed-exitcode, like `terraform plan
-detailed-exitcode`: 0 no change, 2 changes; without it, 0. With
--fail-on-pending: 3 when requests this change adds or alters would stay
pending (a new pending allocation, or one pending for another reason than
without the change), so CI cannot pass a PR that over-subscribes.

An offline plan of two commits is a pure function of them: what it printed
is kept in the on-disk cache and replayed by the next run of the same
commits, policy and format (`planresults`; `--no-cache` turns it off). The
second offline plan against one base commit keeps that base's world (its
tree, problems, implied claims, planned side and placement engine,
`keptworlds`): every later plan against it reads and plans only what head
changes.

`--out FILE` saves the plan for `gpuaas apply FILE` (`reconciler.reconcile.planfiles`):
the revisions, the content hash of head, a digest of the database state it
was computed against and the decisions. Nothing is saved when head is invalid.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler import codes as reconciler_codes
from reconciler import exiting
from reconciler.caches import cachefiles, checkedtrees
from reconciler.commands import db
from schemas import output, progress
from schemas.errors import PermanentError, UsageError

if TYPE_CHECKING:
    from desired.state import DesiredState
    from reconciler import plans
    from reconciler.placement import prplan, replanning

EXIT_CHANGES = 2
EXIT_PENDING = 3


def register(sub: Any) -> None:
    # allow_abbrev=False: `--out` is its own flag, never an abbreviation of `--output`.
    p = sub.add_parser(
        "plan", help="what merging a revision would do (a PR plan), with terraform-style exit codes", allow_abbrev=False
    )
    p.add_argument("path", nargs="?", default=Path("."), type=Path, help="desired-state repo (default .)")
    p.add_argument("--base", help="base revision (default: what the database runs; offline: nothing)")
    p.add_argument("--head", help="revision to plan (default HEAD; the directory itself outside git)")
    output.add_argument(p, "text", "markdown")
    p.add_argument("--detailed-exitcode", action="store_true", help="exit 0 no change, 1 error, 2 changes")
    p.add_argument(
        "--fail-on-pending",
        action="store_true",
        help="exit 3 when requests this change adds or alters would stay pending",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="save the plan for `gpuaas apply FILE`")
    p.add_argument("--offline", action="store_true", help="no database: plan head against what base implies")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    db.add_database_arguments(p)
    checkedtrees.add_arguments(p)
    progress.add_argument(p)
    p.set_defaults(func=run)


def _load(path: Path, rev: str | None, reader: checkedtrees.Reader) -> tuple[DesiredState, tuple[Any, ...]]:
    result = reader.load(path, rev)
    return result.state, tuple(result.errors)


def _online(
    args: argparse.Namespace, reader: checkedtrees.Reader, given: tuple[DesiredState, tuple[Any, ...]]
) -> tuple[DesiredState, tuple[Any, ...], plans.Observed, str]:
    """Base, its problems, the observed state, and the digest a saved plan pins (planfiles.observed_digest).

    `given`: `--base` and its problems, read already (`_given_base`).
    """
    from desired.reading import gitrepo
    from desired.state import DesiredState
    from reconciler import plans
    from reconciler.reconcile import planfiles
    from reconciler.store import connections, live, migrations, views

    with connections.connect(db.database_url(args), autocommit=True) as conn, conn.transaction():
        # One transaction (repeatable read): the observed state and its digest are one snapshot.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        if not migrations.applied(conn):
            print("note: the database has no schema yet; planning against an empty fleet", file=sys.stderr)
            base, errors = given if args.base else (DesiredState(), ())
            return base, errors, plans.Observed(), planfiles.observed_digest(plans.Observed(), 0)
        observed = live.observe(conn)
        digest = planfiles.observed_digest(observed, views.inventory_generation(conn))
        if args.base:
            return *given, observed, digest
        current = views.current_revision(conn)
        if current and not current.startswith("tree:") and gitrepo.head(args.path) is not None:
            try:
                base, errors = _load(args.path, current, reader)
                return base, errors, observed, digest
            except PermanentError:  # a revision this clone lacks: fall back to the stored inventory
                pass
        return views.desired_state(conn), (), observed, digest


def run(args: argparse.Namespace) -> int:
    # No cyclic collection from here on, imports included: what they and the plan make lives until
    # the process ends, and each collection on the way walked all of it (the pydantic models' import
    # alone set off several); the collector runs again as it was once the command is done.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args)
    finally:
        if enabled:
            gc.enable()


def _run(args: argparse.Namespace) -> int:
    from desired.reading import gitrepo, loading
    from reconciler.caches import planresults

    head_rev = args.head or ("HEAD" if gitrepo.head(args.path) is not None else None)
    reader = checkedtrees.open_reader(args)  # base and head share it: a document both hold is parsed once
    cache_key = planresults.key(args, head_rev)
    outcome = planresults.get(reader.cache.disk, cache_key)  # None unless offline, from git, without --out
    saved = None
    if outcome is None:
        # Two trees loaded and planned are millions of long-lived objects: full collections
        # walked them all (a third of the run at 10,000 nodes) for no memory back.
        with loading.collector_paused(), progress.for_args(args, "plan") as shown, shown.phase("plan"):
            try:
                pr, head, digest = _plan(args, head_rev, reader)
            except cachefiles.Damaged as e:  # a kept base's file changed on disk after it was opened
                print(f"note: kept base not used: {e}; planning without it", file=sys.stderr)
                reader = checkedtrees.open_reader(args)  # the first try's reader holds parts of that base
                pr, head, digest = _plan(args, head_rev, reader, kept=False)
            exiting.skip_teardown()  # holds two trees' models: the console script need not free them
        outcome = planresults.Outcome(
            _render(pr, args.output),
            len(pr.errors),
            pr.changed,
            tuple((x.allocation_id, x.code) for x in pr.new_pending),
        )
        planresults.put(reader.cache.disk, cache_key, outcome)
        saved = (pr, head, digest)
    sys.stdout.write(outcome.printed)
    if outcome.errors:
        print(f"error: plan.invalid: {outcome.errors} validation error(s) in head; nothing planned", file=sys.stderr)
        return 1
    if args.out is not None and saved is not None:
        _save(args, *saved)
    if args.fail_on_pending and outcome.new_pending:
        listed = ", ".join(f"{allocation} ({code})" for allocation, code in outcome.new_pending)
        print(
            f"error: plan.pending: {len(outcome.new_pending)} request(s) this change adds or alters would stay "
            f"pending: {listed}",
            file=sys.stderr,
        )
        return EXIT_PENDING
    return EXIT_CHANGES if args.detailed_exitcode and outcome.changed else 0


def _plan(
    args: argparse.Namespace, head_rev: str | None, reader: checkedtrees.Reader, *, kept: bool = True
) -> tuple[prplan.PrPlan, DesiredState, str]:
    """The PR plan, the head it planned and the digest of the observed state it was planned against.

    `kept=False`: base is read and planned, never taken from a kept world.
    """
    from desired.state import LoadResult
    from reconciler.caches import keptworlds
    from reconciler.placement import prplan, replanning
    from reconciler.reconcile import planfiles

    digest = ""
    world_key, base_commit = _world_key(args)
    world = keptworlds.get(reader.cache.disk, world_key, args.policy) if kept else None
    keep: Callable[[prplan.BaseSide, plans.Observed], None] | None = None
    if world is not None:
        exiting.hold(world)  # freed by the process's end, not object by object when this returns
        # Base as an earlier run left it: head is read by delta from its tree, its side is not planned again.
        reader.cache.tree = world.tree
        reader.memo.adopt(LoadResult(world.state, []), list(world.found), world.owners)
        base, base_errors, base_unreadable = world.state, (), None
        warm = world.planner
    else:
        base, base_errors, base_unreadable = _given_base(args, reader)
        warm = replanning.WarmPlanner(args.policy)  # one kept engine for every plan of this run
        keep = _keeper(
            reader,
            world_key=world_key,
            base_commit=base_commit,
            base_errors=base_errors,
            base_unreadable=base_unreadable,
            warm=warm,
        )
    read = reader.load(args.path, head_rev)
    head, head_errors = read.state, tuple(read.errors)
    if head_errors:
        return prplan.invalid(args.base, head.revision, head_errors, offline=args.offline), head, digest
    if base_unreadable is not None:
        raise base_unreadable
    side = None
    if args.offline:
        if world is not None:
            observed, side = world.observed, world.side
        else:
            observed = _guard(lambda: prplan.offline_observed(base, policy=args.policy, plan_with=warm))
        digest = planfiles.observed_digest(observed, 0)
    else:
        base, base_errors, observed, digest = _online(args, reader, (base, base_errors))
    requests = len(head.allocations)
    with progress.active().phase("plan requests", requests, unit="requests") as counted:
        pr = _guard(
            lambda: prplan.compose(
                base,
                head,
                observed,
                offline=args.offline,
                base_errors=base_errors,
                policy=args.policy,
                plan_with=warm,
                engine_for=warm.engine,
                side=side,
                keep=(lambda s: keep(s, observed)) if keep is not None else None,
                delta=read.delta,
            )
        )
        counted.done = requests  # the planner places them together: counted when it is done
    return pr, head, digest


def _world_key(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """Where this run's base world is kept, and the base commit: (None, None) when it is not kept.

    Offline only (online, the claims are the database's), with `--base`
    naming a commit and the on-disk cache on.
    """
    from reconciler.caches import keptworlds

    if not args.offline or not args.base or getattr(args, "no_cache", False):
        return None, None
    commit = checkedtrees.commit_of(args.path, args.base)
    return (keptworlds.key(args.path, commit, args.policy), commit) if commit is not None else (None, None)


def _keeper(
    reader: checkedtrees.Reader,
    *,
    world_key: str | None,
    base_commit: str | None,
    base_errors: tuple[Any, ...],
    base_unreadable: PermanentError | None,
    warm: replanning.WarmPlanner,
) -> Callable[[prplan.BaseSide, plans.Observed], None] | None:
    """What keeps base's world once its side is planned, or None when it is not kept this run.

    Kept once a base is planned the second time (an earlier run stored its
    checked tree): a base planned once pays nothing for keeping, and one CI
    plans against again and again is planned from the kept world from then on.
    """
    from reconciler.caches import keptworlds

    disk, tree = reader.cache.disk, reader.cache.tree
    if (
        disk is None
        or world_key is None
        or base_commit not in reader.seen
        or base_errors
        or base_unreadable is not None
        or tree is None
        or tree.revision != base_commit
        or tree.problems
    ):
        return None
    found, owners = list(reader.problems), dict(reader.memo.owners)  # base's: head is not read yet

    def keep(side: prplan.BaseSide, observed: plans.Observed) -> None:
        payload = keptworlds.dump(tree, found=found, owners=owners, observed=observed, side=side, planner=warm)
        keptworlds.put(disk, world_key, payload)

    return keep


def _given_base(
    args: argparse.Namespace, reader: checkedtrees.Reader
) -> tuple[DesiredState, tuple[Any, ...], PermanentError | None]:
    """`--base`, read before head, its problems, and why it could not be read.

    Read first, base is the tree head is read by delta from (`git diff-tree`
    base..head: only the files the PR changes are parsed and validated, see
    `desired.reading.deltas`), and the inventory diff, the node modes and the warm
    planner work from that delta too. An unreadable base is raised only once
    head turned out valid, as when head was read first. Without `--base`,
    online, base is the revision the database runs: read after head, whose
    errors need no database (`_online`).
    """
    from desired.state import DesiredState

    if not args.base:
        return DesiredState(), (), None
    try:
        base, errors = _load(args.path, args.base, reader)
    except PermanentError as e:
        return DesiredState(), (), e
    return base, errors, None


def _save(args: argparse.Namespace, pr: prplan.PrPlan, head: DesiredState, observed_digest: str) -> None:
    from reconciler.reconcile import planfiles
    from reconciler.store import inventoryrows  # the content hash the sync records

    desired_hash = inventoryrows.content_hash(head)
    doc = planfiles.document(
        pr,
        repo=args.path,
        head_revision=inventoryrows.revision_key(head, desired_hash),
        desired_hash=desired_hash,
        observed=observed_digest,
        policy=args.policy,
    )
    planfiles.write(args.out, doc)
    how = "offline: for review only, apply refuses it" if pr.offline else f"apply it with `gpuaas apply {args.out}`"
    print(f"plan saved to {args.out} ({how})", file=sys.stderr)


def _guard(fn: Any) -> Any:
    try:
        return fn()
    except ValueError as e:  # an unknown --policy name
        raise UsageError(str(e), code=reconciler_codes.PLAN_POLICY_UNKNOWN) from e


def _render(pr: prplan.PrPlan, fmt: str) -> str:
    """What the command prints on stdout, exactly (the plan cache replays it)."""
    from reconciler.placement import prplan_render

    if output.structured(fmt):
        return output.dumps(prplan_render.as_dict(pr), fmt) + "\n"
    if fmt == "markdown":
        return prplan_render.render_markdown(pr)
    return prplan_render.render_text(pr) + "\n"
