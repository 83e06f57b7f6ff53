"""`gpuaas apply [PATH|PLANFILE] [--rev REV] [--allow-dirty] [--allow-rewind] [-o text|json]`: apply a revision.

Sync the inventory, absorb host reports, plan, write claims (one transaction
per placement), record releases, write host plans, and print what changed:
placements, pending allocations with their reasons, releases. Applying the
same revision again changes nothing and says so.

What is applied is what history records:

- PATH inside a git repository: the committed tree (`--rev`, default
  `HEAD`), read from git objects like `gpuaas run`. When the working tree
  under PATH differs from HEAD (a YAML file modified, added or deleted and
  not committed), apply refuses (`apply.tree_dirty`, naming the files), so a
  revision in history always holds what was placed. `--allow-dirty` applies
  the working tree as it is instead, recorded as `tree:<hash>`, never as a
  commit that does not contain it.
- A commit that does not descend from the last applied commit (older, or on
  another line of history) is refused (`apply.rewind`), listing the
  allocations and nodes it would drop and the placed allocations it would
  orphan, unless `--allow-rewind` (`reconciler.commands.rewinds`).
- PATH outside git: the directory as it is, recorded as `tree:<hash>`.
- PLANFILE (written by `gpuaas plan --out`): exactly that plan, refused
  (`apply.plan_stale`) when the desired state or the database moved since it
  was made (see `reconciler.reconcile.planfiles`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from desired.reading import safefiles
from desired.state import LoadResult
from reconciler import codes as reconciler_codes
from reconciler.commands import db
from schemas import output, progress
from schemas.errors import PermanentError, UsageError

if TYPE_CHECKING:
    pass

DIRTY_LISTED = 20  # files named in an apply.tree_dirty message; the rest are counted


def register(sub: Any) -> None:
    p = sub.add_parser(
        "apply", help="sync, plan and write claims for a desired-state revision or a saved plan", allow_abbrev=False
    )
    p.add_argument(
        "path",
        nargs="?",
        default=Path("."),
        type=Path,
        metavar="PATH|PLANFILE",
        help="desired-state repo (default .), or a plan file written by `gpuaas plan --out`",
    )
    p.add_argument("--rev", help="apply the tree at this git revision (default: HEAD; outside git: the directory)")
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="apply the working tree even where it differs from HEAD (recorded as tree:<hash>)",
    )
    p.add_argument(
        "--allow-rewind",
        action="store_true",
        help="apply a commit that does not descend from the applied one (refused otherwise: apply.rewind)",
    )
    p.add_argument(
        "--repo", type=Path, help="with PLANFILE: the repo to read its head from (default: where it was planned)"
    )
    output.add_argument(p, "text")
    p.add_argument("--policy", help="placement policy override (default: the Fleet's)")
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list every host plan written (default: their count; -o json always lists them)",
    )
    progress.add_argument(p)
    db.add_database_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from desired.reading import loading
    from reconciler import exiting

    if args.path.exists() and not args.path.is_dir():  # a FIFO or a device too: refused as a plan file, unread
        return _run_saved(args)
    if args.repo is not None:
        raise UsageError(
            "--repo goes with a plan file; give the repo itself as PATH", code=reconciler_codes.APPLY_USAGE
        )
    # The collector stays paused from the read to the end of the apply: let go between them, its first full
    # collection walked the whole new tree (millions of objects at 10,000 nodes) and found nothing to free.
    with loading.collector_paused(), progress.for_args(args, "apply") as shown:
        with shown.phase("read desired state"), _importing_beside():
            loaded = load(args.path, args.rev, allow_dirty=args.allow_dirty)
        if loaded.errors:
            for problem in loaded.errors:
                print(problem.render(), file=sys.stderr)
            raise PermanentError(
                f"{len(loaded.errors)} validation error(s): nothing applied", code=reconciler_codes.APPLY_INVALID
            )
        from reconciler.commands import rewinds
        from reconciler.reconcile import reconciling
        from reconciler.store import connections, migrations

        url = db.database_url(args)
        with connections.connect(url, autocommit=True) as conn:
            migrations.migrate(conn)
            back = rewinds.check(conn, args.path, loaded.state, allow=args.allow_rewind)
            source = f"cli {args.path}" + (f" (rewind from {back.applied[:12]})" if back is not None else "")
            try:
                result = reconciling.reconcile(
                    conn,
                    loaded.state,
                    policy=args.policy,
                    source=source,
                    shown=shown,
                    connect=lambda: connections.connect(url, autocommit=True),  # host plans' second session
                )
            except reconciling.Invalid as e:  # an edit of an allocation that holds claims: printed as validation
                for problem in e.problems:
                    print(problem.render(), file=sys.stderr)
                raise PermanentError(
                    f"{len(e.problems)} error(s) against the store: nothing applied, the last "
                    "valid revision stays in force",
                    code=reconciler_codes.APPLY_INVALID,
                ) from None
        exiting.skip_teardown()  # its connections are closed; it holds a tree's models, nothing to finalize
    _print(reconciling.summary(result), args.output, verbose=args.verbose)
    return 0


@contextlib.contextmanager
def _importing_beside() -> Iterator[None]:
    """Import what applying needs beyond reading while the tree is read.

    The store, the planner and psycopg were 0.3 s of imports before a cold
    apply of 10,000 nodes could start reading; the reader waits on its pool's
    workers most of that time. Joined before the block ends, whatever happens
    in it: a thread left importing could outlive the interpreter's teardown.
    """

    def imports() -> None:
        from reconciler.commands import rewinds  # noqa: F401
        from reconciler.reconcile import reconciling  # noqa: F401
        from reconciler.store import connections, migrations  # noqa: F401

    beside = threading.Thread(target=imports, name="apply-imports", daemon=True)
    beside.start()
    try:
        yield
    finally:
        beside.join()  # an import that failed there fails again, in the open, where it is used


def load(path: Path, rev: str | None, *, allow_dirty: bool = False) -> LoadResult:
    """The desired state apply reconciles, with the revision history will record.

    In git: the committed tree (`rev`, default HEAD). Without `rev`, a working
    tree that differs from HEAD under `path` is refused unless `allow_dirty`,
    and then read as it is with no commit as its revision (history records
    `tree:<hash>`). Outside git (or before the first commit): the directory.
    """
    from desired.reading import gitrepo
    from reconciler import sources

    if rev is not None:
        if allow_dirty:
            raise UsageError(
                "--allow-dirty applies the working tree and --rev a commit: give one of them",
                code=reconciler_codes.APPLY_USAGE,
            )
        return sources.load(path, rev)
    if not path.exists():
        return sources.load(path)  # desired.path.missing
    if gitrepo.head(path) is None:
        return _as_tree(sources.load(path))
    dirty = dirty_files(path)
    if not dirty:
        return sources.load(path, "HEAD")
    if not allow_dirty:
        listed = ", ".join(dirty[:DIRTY_LISTED]) + (
            f" and {len(dirty) - DIRTY_LISTED} more" if len(dirty) > DIRTY_LISTED else ""
        )
        raise PermanentError(
            f"{len(dirty)} desired-state file(s) under {path} differ from HEAD: {listed}; apply reads the "
            "committed tree, so commit them (or pass --allow-dirty to apply the working tree, recorded as "
            "tree:<hash>, not as a commit)",
            code=reconciler_codes.APPLY_TREE_DIRTY,
        )
    print(
        f"warning: applying the working tree: {len(dirty)} file(s) differ from HEAD; history records it as tree:<hash>",
        file=sys.stderr,
    )
    return _as_tree(sources.load(path))


def _as_tree(loaded: LoadResult) -> LoadResult:
    loaded.state.revision = None  # no commit holds this tree: history records tree:<content hash>
    return loaded


def dirty_files(path: Path) -> list[str]:
    """YAML files under `path` whose working copy differs from HEAD, as `path (how)`, sorted.

    Compares exactly what the two readers would read: a YAML file of the
    directory (by git blob id) against the same file of HEAD under `path`.
    Only the files git's index does not vouch for are read and compared
    (`dirtytree.candidates`); every file, where git cannot vouch for the tree.
    Untracked files git ignores are not desired state and are left out.
    """
    from reconciler.commands import dirtytree

    names = dirtytree.candidates(path)
    committed = _committed(path, names)
    working = _working(path, names)
    out: dict[str, str] = {}
    for name in sorted(set(committed) | set(working)):
        if name not in working:
            out[name] = "deleted"
        elif name not in committed:
            out[name] = "untracked"
        elif committed[name] != working[name]:
            out[name] = "modified"
    untracked = [name for name, how in out.items() if how == "untracked"]
    for name in _ignored(path, untracked):
        del out[name]
    return [f"{name} ({how})" for name, how in out.items()]


NAMED_MAX = 1000  # more files than this are looked up in HEAD's whole listing, not one by one


def _committed(path: Path, names: set[str] | None) -> dict[str, str | None]:
    """Name -> HEAD's blob id (None: a symlink) of the files named (None: of every file) under `path`."""
    from desired.reading import gitrepo

    try:
        if names is not None and len(names) > NAMED_MAX:
            whole = gitrepo.revision_blob_ids(path, "HEAD")
            return {name: whole[name] for name in names if name in whole}
        return gitrepo.revision_blob_ids(path, "HEAD", names)
    except gitrepo.RevisionError:  # path itself is not in HEAD: every file in it is new
        return {}


def _working(path: Path, names: set[str] | None) -> dict[str, str | None]:
    """Name -> blob id (None: not read, a symlink or a FIFO) of the files named (None: of every file) that
    the working tree holds."""
    found: Iterable[tuple[str, safefiles.FileData | None]]
    if names is None:
        found = safefiles.iter_directory(path)
    else:
        found = ((name, safefiles.read_at(path, name)) for name in sorted(names))
    return {
        name: safefiles.blob_id(data) if isinstance(data, bytes) else None for name, data in found if data is not None
    }


def _ignored(path: Path, names: list[str]) -> list[str]:
    if not names:
        return []
    import git

    try:
        with git.Repo(path, search_parent_directories=True) as repo:
            top = Path(repo.working_tree_dir or path).resolve()
            prefix = path.resolve().relative_to(top)
            full = {(prefix / name).as_posix(): name for name in names}
            return [full[p] for p in repo.ignored(*full) if p in full]
    except (git.GitError, ValueError):  # no answer from git: keep listing them
        return []


def _run_saved(args: argparse.Namespace) -> int:
    """`gpuaas apply PLANFILE`: exactly the saved plan, or apply.plan_stale."""
    from reconciler.reconcile import planfiles, reconciling
    from reconciler.store import connections, inventoryrows, migrations

    if args.rev is not None or args.allow_dirty or args.policy is not None:
        raise UsageError(
            "a saved plan fixes its revision and policy: --rev, --allow-dirty and --policy do not apply to it",
            code=reconciler_codes.APPLY_USAGE,
        )
    saved = planfiles.read(args.path)
    repo = args.repo if args.repo is not None else Path(saved.repo)
    loaded = planfiles.load_head(saved, repo)
    if loaded.errors:  # the revision was valid when planned; a tree read again may not be
        raise PermanentError(
            f"the planned head {saved.head_revision} has {len(loaded.errors)} validation error(s) now",
            code=reconciler_codes.APPLY_PLAN_STALE,
        )
    planfiles.check_desired(saved, inventoryrows.content_hash(loaded.state))
    url = db.database_url(args)
    with connections.connect(url, autocommit=True) as conn:
        migrations.migrate(conn)
        planfiles.check_database(saved, planfiles.database_digest(conn))
        result = reconciling.reconcile(
            conn,
            loaded.state,
            source=f"cli plan {args.path}",
            planner=planfiles.guarded_planner(saved),
            connect=lambda: connections.connect(url, autocommit=True),  # host plans' second session
        )
    doc = reconciling.summary(result)
    if args.output == "text":
        print(f"applied saved plan {args.path} (head {saved.head_revision})")
    _print(doc, args.output, verbose=args.verbose)
    return 0


def _print(doc: dict[str, Any], fmt: str, *, verbose: bool = False) -> None:
    if output.structured(fmt):
        output.emit(doc, fmt)
    else:
        print(render_text(doc, verbose=verbose))


PLANS_LISTED = 20  # host plans named in text without -v (a cold apply writes one per node)


def render_text(doc: dict[str, Any], *, verbose: bool = False) -> str:
    out = [f"revision {doc['revision']}"]
    out += _inventory_lines(doc)
    out += _placement_lines(doc)
    out += _release_lines(doc)
    plans = doc["host_plans"]
    if plans and (verbose or len(plans) <= PLANS_LISTED):
        out.append(f"host plans written ({len(plans):,}):")
        out += [f"  {h['node']}@{h['generation']}" for h in plans]
    elif plans:
        out.append(f"{len(plans):,} host plans written (-v lists them)")
    if not doc["changed"]:
        out.append("no changes: the store already matches this revision")
    return "\n".join(out)


def _inventory_lines(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    inventory = doc["inventory"]
    if len(inventory) > 12:
        counts = Counter(" ".join(line.split(" ")[::2]) for line in inventory)  # "slot added"
        out.append(
            f"inventory: {len(inventory)} change(s): "
            + ", ".join(f"{n} {kind_action}" for kind_action, n in sorted(counts.items()))
        )
    elif inventory:
        out.append(f"inventory: {len(inventory)} change(s)")
        out += [f"  {line}" for line in inventory]
    for f in doc["freed"]:
        where = f"{f['node']}:{f['slot_index']}" if f["slot_index"] is not None else (f["node"] or "")
        out.append(f"cleanup: {f['allocation_id']} {where} {f['outcome']}")
    return out


def _placement_lines(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if doc["placements"]:
        out.append("placed:")
        for p in doc["placements"]:
            slots = ",".join(str(i) for i in p["slot_indexes"]) or "whole node"
            raced = f"  (after {p['conflicts']} lost race(s))" if p["conflicts"] else ""
            out.append(f"  {p['allocation_id']:<24} {p['node']} [{slots}]{raced}")
    if doc["pending"]:
        out.append("pending:")
        for p in doc["pending"]:
            out.append(f"  {p['allocation_id']:<24} {p['code']}: {p['message']}")
    return out


def _release_lines(doc: dict[str, Any]) -> list[str]:
    out: list[str] = []
    changed_releases = [r for r in doc["releases"] if r["outcome"] in ("releasing", "cancelled")]
    if changed_releases or doc["cancelled"]:
        out.append("released:")
        for r in changed_releases:
            if r["outcome"] == "releasing":
                slots = ",".join(str(i) for i in r["slot_indexes"]) or "whole node"
                out.append(
                    f"  {r['allocation_id']:<24} {r['node']} [{slots}] -> cleanup "
                    "(returned to service only on wipe proof)"
                )
            else:
                out.append(f"  {r['allocation_id']:<24} never placed: released")
        out += [f"  {a:<24} never placed: released" for a in doc["cancelled"]]
    return out
