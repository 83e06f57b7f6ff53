"""The cross-file rules of a revision read whole, run while its inventory sync waits on the server.

The watch loop's first revision (and any other read whole) syncs every
inventory row: a COPY of about 90,000 rows at 10,000 nodes, during which
this process mostly waits on PostgreSQL. The rules (`policies.validation`,
about half a second there) run meanwhile in a thread, and the sync's
transaction commits only once they pass (`inventory.sync`'s
`before_commit`): a tree that breaks a rule is refused as before, its
problems recorded once in history, and nothing it would have written stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent import futures

from desired.state import LoadResult
from reconciler import sources
from reconciler.reconcile import reconciling
from reconciler.store import history
from reconciler.store.connections import Connection


class Broken(reconciling.Invalid):
    """The tree breaks a cross-file rule (found while the sync waited): refused like invalid YAML."""

    def __init__(self, loaded: LoadResult) -> None:
        super().__init__(loaded.errors)
        self.loaded = loaded


@contextlib.contextmanager
def rules(parsed: LoadResult, check: sources.Check) -> Iterator[Callable[[], LoadResult]]:
    """Start `check` on `parsed` in a thread; yields `passed`, which waits for it and raises `Broken` on errors.

    Leaving the block waits for the rules too, so nothing runs them behind the caller's back.
    """
    with futures.ThreadPoolExecutor(1, thread_name_prefix="gpuaas-rules") as pool:
        job = pool.submit(sources.checked, parsed, check)

        def passed() -> LoadResult:
            loaded = job.result()
            if loaded.errors:
                raise Broken(loaded)
            return loaded

        yield passed


def refused(conn: Connection, rev: str, source: str, loaded: LoadResult) -> int:
    """Record a revision refused for its problems: one history row with every error (what `Broken` leaves)."""
    run_id = history.start(conn, revision=rev, source=source)
    reconciling.finish_refused(conn, run_id, loaded.errors)
    return run_id
