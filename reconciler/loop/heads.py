"""The git revisions the GitOps loop follows (`watching.Revisions`).

- `LocalHead`: a local checkout. The loop reconciles the *committed* HEAD,
  read straight from git objects (like `validate --rev`), never the working
  tree: a half-saved file or an uncommitted experiment is not desired state,
  and the revision recorded in history is a commit anyone can check out.
  watchfiles watches, each without its subdirectories, the git directory
  (HEAD, packed-refs) and the directory of the branch HEAD names (for
  `main`, refs/heads), with a short debounce, so a `git commit`, a merge, a
  `git pull` or a `git checkout` wakes the loop at once. objects/ is never
  watched: a `git gc` on a 200,000-file repo deletes as many loose objects,
  and when the whole git directory was watched, sorting out those events
  held a commit back for 25 s at 100,000 nodes (the first commit after a
  cold start of `bench gitops`, while the fleet's first commit was packed).
  The directories are worked out again on every wake (a checkout of another
  branch moves HEAD); a tick (`tick_s`) wakes the loop anyway.
- `RemoteBranch`: a clone polled every `interval` seconds with gitpython
  (`git fetch REMOTE +refs/heads/B:refs/remotes/REMOTE/B`, argv, no shell);
  the tree is read at the fetched commit, the checkout is never touched.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import git

from desired.reading import gitrepo
from reconciler import codes as reconciler_codes
from schemas.errors import GpuaasError, TemporaryError, UsageError

# Only these entries of the git directory say "a ref may have moved".
_GIT_REF_PATHS = ("HEAD", "packed-refs", "FETCH_HEAD", "ORIG_HEAD")


def _repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        raise GpuaasError(
            f"{path} is not inside a git repository; the loop reconciles commits",
            code=reconciler_codes.GITOPS_NOT_A_REPO,
        ) from e


class _GitRevisions:
    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.repo = _repo(path)
        self.label = label

    def is_ancestor(self, older: str, newer: str) -> bool:
        try:
            if older == newer:
                return False
            old, new = self.repo.commit(older), self.repo.commit(newer)
            # The loop's everyday question, "is the new commit an ancestor of the one applied before it
            # (its parent)?", answered from the commits it already reads: a commit is no ancestor of its
            # own parent. Each `git merge-base` is a process forked from the loop, 2.8 GB at 100,000 nodes.
            if new in old.parents:
                return False
            if old in new.parents:
                return True
            return bool(self.repo.is_ancestor(old, new))
        except (git.GitCommandError, git.BadName, ValueError):
            return False  # a revision this clone does not have

    def close(self) -> None:
        self.repo.close()


class LocalHead(_GitRevisions):
    """The committed HEAD of a local checkout, woken by watchfiles on the git directory."""

    def __init__(
        self, path: Path, stop: threading.Event, *, debounce_ms: int = 200, step_ms: int = 20, tick_s: float = 1.0
    ) -> None:
        super().__init__(path, f"watch:{Path(path).resolve()}")
        self.git_dir, self.common_dir = Path(self.repo.git_dir).resolve(), Path(self.repo.common_dir).resolve()
        self.stop = stop
        self.debounce_ms, self.step_ms, self.tick_ms = debounce_ms, step_ms, max(1, int(tick_s * 1000))
        self._changes: Any = None
        self.watched: tuple[Path, ...] = ()

    def current(self) -> str | None:
        try:
            return str(self.repo.head.commit.hexsha)
        except ValueError:  # an unborn branch: nothing committed yet
            return None

    def _dirs(self) -> tuple[Path, ...]:
        """The git directory (and a worktree's common one), and the directory of HEAD's branch ref: its
        nearest existing one, as a packed-only branch's may not exist yet (its creation wakes the loop)."""
        dirs = {self.git_dir, self.common_dir}
        try:
            head = (self.git_dir / "HEAD").read_text(errors="replace")
        except OSError:
            head = ""  # the tick still wakes the loop
        if head.startswith("ref:"):
            ref = (self.common_dir / head[4:].strip()).parent
            while ref != self.common_dir and not ref.is_dir():
                ref = ref.parent
            if ref.is_relative_to(self.common_dir / "refs"):  # never a directory outside the refs
                dirs.add(ref)
        return tuple(sorted(dirs))

    def _wanted(self, _change: Any, path: str) -> bool:
        at = Path(path)
        if at.parent in (self.git_dir, self.common_dir):
            return at.name in _GIT_REF_PATHS
        return True  # an entry of the branch's ref directory

    def wait(self, timeout: float) -> None:
        if self.stop.is_set():
            return
        dirs = self._dirs()
        if self._changes is None or dirs != self.watched:
            import watchfiles

            if self._changes is not None:
                self._changes.close()
            self.watched = dirs
            # yield_on_timeout: wake every tick so the loop can run retries and notice a stop.
            self._changes = watchfiles.watch(
                *dirs,
                watch_filter=self._wanted,
                debounce=self.debounce_ms,
                step=self.step_ms,
                stop_event=self.stop,
                rust_timeout=min(self.tick_ms, max(1, int(timeout * 1000))),
                yield_on_timeout=True,
                raise_interrupt=False,
                recursive=False,
            )
        next(self._changes, None)

    def close(self) -> None:
        if self._changes is not None:
            self._changes.close()
        super().close()


class RemoteBranch(_GitRevisions):
    """A branch of a remote, fetched into a local clone every poll."""

    def __init__(
        self, path: Path, remote: str, branch: str, stop: threading.Event, *, retry_delay: float = 30.0
    ) -> None:
        # The names reach `git fetch`: git's ref-name rules (no leading '-') and a configured
        # remote only, and they go after '--', so no value can become an option.
        try:
            gitrepo.check_ref_name(remote, "remote")
            gitrepo.check_ref_name(branch, "branch")
        except gitrepo.RefNameError as e:
            raise UsageError(str(e), code=e.code) from e
        super().__init__(path, f"git:{remote}/{branch}")
        if remote not in {r.name for r in self.repo.remotes}:
            self.repo.close()
            raise UsageError(
                f"no remote named {remote!r} in {self.repo.git_dir}; add it with `git remote add`",
                code=reconciler_codes.GITOPS_REMOTE_UNKNOWN,
            )
        self.remote, self.branch, self.stop = remote, branch, stop
        self.retry_delay = retry_delay  # after a failed fetch: the next poll, not a tight loop

    def current(self) -> str | None:
        ref = f"refs/remotes/{self.remote}/{self.branch}"
        try:
            self.repo.git.fetch("--", self.remote, f"+refs/heads/{self.branch}:{ref}")
            return str(self.repo.commit(ref).hexsha)
        except (git.GitCommandError, ValueError, git.BadName) as e:
            raise TemporaryError(
                f"cannot fetch {self.remote}/{self.branch}: {str(e).strip()}",
                code=reconciler_codes.GITOPS_FETCH,
                delay=self.retry_delay,
            ) from e

    def wait(self, timeout: float) -> None:
        self.stop.wait(timeout)
