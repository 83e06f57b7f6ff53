"""The GitOps part of `make demo`: a pull request's plan in markdown, the merge applied, the status.

The example fleet is put in a throwaway git repository as two commits: main
without the slot map of h200-use1-s02 and without two slice requests, and a
PR branch that approves those slots and adds the requests. The demo prints
the PR comment CI would post (`gpuaas plan -o markdown --offline`), merges the
branch, lets the reconciler loop apply it once (`gpuaas run --once`), then
prints `gpuaas status` and `gpuaas history`. The merged tree is the example
fleet itself, so applying it again (a second `make demo`) changes nothing.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import git

from reconciler import sources
from reconciler.commands import history, status
from reconciler.loop import heads, watching
from reconciler.placement import prplan, prplan_render
from reconciler.reports import history as history_report
from reconciler.store import connections

PR_FILES = ("slotmaps/h200-use1-s02.yaml", "allocations/alloc-0002.yaml", "allocations/alloc-0003.yaml")
DEMO_AUTHOR = git.Actor("gpuaas demo", "demo@gpuaas.invalid")

Out = Callable[[str], None]


def _heading(out: Out, text: str) -> None:
    out(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def _commit(repo: git.Repo, message: str) -> str:
    repo.git.add("-A")
    return str(repo.index.commit(message, author=DEMO_AUTHOR, committer=DEMO_AUTHOR).hexsha)


def _repo(fleet: Path, root: Path) -> git.Repo:
    """main: the fleet without PR_FILES; branch pr: with them."""
    shutil.copytree(fleet, root)
    aside = root.parent / "pr-files"
    moved = [rel for rel in PR_FILES if (root / rel).is_file()]
    for rel in moved:
        (aside / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).rename(aside / rel)
    repo = git.Repo.init(root, initial_branch="main")
    _commit(repo, "fleet before the PR")
    repo.git.checkout("-b", "pr")
    for rel in moved:
        (aside / rel).rename(root / rel)
    _commit(repo, "approve the slots of h200-use1-s02; two slice requests")
    return repo


def run(fleet: Path, url: str, out: Out = print) -> None:
    from reconciler.store import migrations

    with tempfile.TemporaryDirectory(prefix="gpuaas-demo-") as tmp:
        root = Path(tmp) / "desired"
        repo = _repo(fleet, root)
        try:
            _heading(out, "PR plan: gpuaas plan -o markdown --offline --base main --head pr")
            base, head = sources.load(root, "main"), sources.load(root, "pr")
            if head.errors:
                pr = prplan.invalid("main", head.state.revision, tuple(head.errors), offline=True)
            else:
                pr = prplan.compose(
                    base.state,
                    head.state,
                    prplan.offline_observed(base.state),
                    offline=True,
                    base_errors=tuple(base.errors),
                )
            out(prplan_render.render_markdown(pr).rstrip("\n"))
            if not pr.valid:
                return
            _heading(out, "merge the PR and apply it: gpuaas run --once")
            repo.git.checkout("main")
            repo.git.merge("pr", "--ff-only")
            with connections.connect(url, autocommit=True) as conn:
                migrations.migrate(conn)
            stop = threading.Event()
            source = heads.LocalHead(root, stop)
            loop = watching.Loop(
                root,
                source,
                lambda: connections.connect(url, autocommit=True),
                stop=stop,
                log=lambda e: out(e.render()),
            )
            try:
                loop.run(once=True)
            finally:
                source.close()
            _heading(out, "status: gpuaas status")
            out(status.render_text(status.collect(url)))
            _heading(out, "history: gpuaas history -n 5")
            with connections.connect(url, autocommit=True) as conn:
                rows = history_report.recent(conn, 5)
            out(history.render_text(rows))
        finally:
            repo.close()
