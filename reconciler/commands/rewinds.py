"""`gpuaas apply` never goes back silently: a revision that does not descend from the applied one.

The watch loop refuses to apply an ancestor of the newest applied revision (a
stale clone must not roll the fleet back); `gpuaas apply --rev` did it without
a word: allocations left the inventory and a placed one became orphaned. Now
a commit that does not descend from the last applied commit (older, or on
another line of history) is refused with `apply.rewind`, listing what would
leave: allocations dropped from the inventory, placed ones among them that
would keep their claims with nothing to release them (orphaned), and nodes.
`--allow-rewind` applies it anyway, after printing the same list.

Not checked: a working tree (`tree:<hash>`) on either side, and an applied
commit this clone does not have (a warning says so: its history cannot be
read here).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from desired.state import DesiredState
from reconciler import codes as reconciler_codes
from reconciler.store import connections, live, revisions
from schemas import dberrors
from schemas.errors import PermanentError

LISTED = 20  # names per kind in the refusal; the rest are counted
CODE = reconciler_codes.APPLY_REWIND


@dataclass(frozen=True, slots=True)
class Rewind:
    applied: str  # the newest applied commit
    target: str  # the commit asked for
    allocations: tuple[str, ...]  # leave the inventory
    orphaned: tuple[str, ...]  # of those, the ones that hold claims
    nodes: tuple[str, ...]  # leave the inventory

    def lines(self) -> list[str]:
        out = [
            f"  allocation {a} leaves the inventory"
            + (" (holds claims: orphaned, nothing releases it)" if a in self.orphaned else "")
            for a in self.allocations[:LISTED]
        ]
        if len(self.allocations) > LISTED:
            out.append(f"  ... and {len(self.allocations) - LISTED} more allocation(s)")
        out += [f"  node {n} leaves the inventory" for n in self.nodes[:LISTED]]
        if len(self.nodes) > LISTED:
            out.append(f"  ... and {len(self.nodes) - LISTED} more node(s)")
        return out

    def summary(self) -> str:
        return (
            f"{len(self.allocations)} allocation(s) would leave the inventory, {len(self.orphaned)} of them "
            f"placed (orphaned), and {len(self.nodes)} node(s)"
        )


def check(conn: connections.Connection, path: Path, state: DesiredState, *, allow: bool) -> Rewind | None:
    """Refuse (`apply.rewind`) a commit that does not descend from the applied one, unless `allow`.

    Returns the rewind that `allow` lets through (the caller records it), else None.
    """
    target = state.revision
    applied = revisions.latest_applied(conn)
    if target is None or applied is None or applied == target or applied.startswith("tree:"):
        return None
    descends = _descends(path, applied, target)
    if descends is None:
        print(
            f"warning: the applied revision {applied[:12]} is not in this repository; apply cannot tell "
            f"whether {target[:12]} goes back",
            file=sys.stderr,
        )
        return None
    if descends:
        return None
    found = _removed(conn, state, applied, target)
    how = (
        f"revision {target[:12]} does not descend from the applied revision {applied[:12]} (it is older, or "
        "on another line of history)"
    )
    if not allow:
        if found.lines():
            print("\n".join(found.lines()), file=sys.stderr)
        raise PermanentError(
            f"{how}: {found.summary()}; nothing applied. Pass --allow-rewind to apply it anyway", code=CODE
        )
    print(f"warning: {how}; applying it (--allow-rewind): {found.summary()}", file=sys.stderr)
    if found.lines():
        print("\n".join(found.lines()), file=sys.stderr)
    return found


def _descends(path: Path, older: str, newer: str) -> bool | None:
    """Is `older` an ancestor of `newer`? None when this clone does not have `older`."""
    import git

    try:
        with git.Repo(path, search_parent_directories=True) as repo:
            try:
                old = repo.commit(older)
            except (git.BadName, ValueError):
                return None
            return bool(repo.is_ancestor(old, repo.commit(newer)))
    except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        raise PermanentError(f"cannot read the history of {path}: {e}", code=reconciler_codes.APPLY_GIT) from e


def _removed(conn: connections.Connection, state: DesiredState, applied: str, target: str) -> Rewind:
    with dberrors.wrapped("read the applied inventory"):
        allocs = {str(r[0]) for r in conn.execute("SELECT id FROM allocations WHERE present").fetchall()}
        nodes = {str(r[0]) for r in conn.execute("SELECT name FROM nodes WHERE present").fetchall()}
    leaving = sorted(allocs - state.allocations.keys())
    held = live.held(conn)
    return Rewind(
        applied,
        target,
        tuple(leaving),
        tuple(a for a in leaving if a in held),
        tuple(sorted(nodes - state.nodes.keys())),
    )
