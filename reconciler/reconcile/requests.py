"""Allocation requests as the portal bot writes them: one file per request, committed to git.

ruamel.yaml does the writing because a release must keep the file's comments
and key order (an operator may have annotated it). Validation runs with the
new bytes *before* anything is written or committed: an invalid request never
lands, and the bot gets the error codes back.

It parses only what an allocation's rules read (policies.validation): the
new file, the documents it may reference (Fleet regions, SKUs, images) and
any file that spells its id (a duplicate). Every file is still read, but
only those bytes are sniffed: parsing every node and slot-map file would make
each request cost what validating the whole fleet costs (`gpuaas bench
request` times one end to end). A broken node file is CI's to report, not a
reason to refuse a tenant's request.

The bot writes only regular files inside the repo, never through a link: the
repo is input too, and a symlinked `allocations/` or request file (or a hard
link to a file elsewhere) would otherwise send the bot's write outside it.
Every directory below the repo root is opened with O_NOFOLLOW, one level at a
time; a new file is created with O_EXCL, an existing one is replaced by an
atomic rename of a file written beside it, never opened for writing.
Anything else is refused with `request.file.not_regular` and nothing is written.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from desired import models as m
from desired import problems as p
from desired.reading import loading, safefiles
from policies import validation
from reconciler import codes as reconciler_codes
from reconciler.reconcile.requestfiles import (
    _create,
    _directory,
    _existing,
    _put_back,
    _read_regular,
    _remove,
    _replace,
)
from schemas.errors import PermanentError

if TYPE_CHECKING:
    import git

_ID = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")  # the rule of models.Allocation.id, checked before any path is made

BOT_NAME = "gpuaas-portal-bot"
BOT_EMAIL = "portal-bot@gpuaas.invalid"
ALLOCATIONS_DIR = "allocations"


class RequestRejected(PermanentError):
    """The request would make the repo invalid; nothing was written."""

    code = reconciler_codes.REQUEST_INVALID

    def __init__(self, problems: list[p.Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(x.render() for x in problems))


@dataclass(frozen=True, slots=True)
class Written:
    allocation_id: str
    path: Path
    commit: str | None


def new_id(now: dt.datetime) -> str:
    return f"req-{now:%Y%m%d}-{secrets.token_hex(4)}"


def _yaml() -> YAML:
    y = YAML()  # round-trip mode: keeps comments, order and quoting
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096
    return y


def render_request(
    *,
    allocation_id: str,
    tenant: str,
    sku: str,
    gpus: int,
    region: str,
    image: str | None,
    ssh_keys: list[str],
    requested_at: dt.datetime,
    vm_profile: str | None = None,
    lease_hours: float | None = None,
) -> bytes:
    doc: dict[str, object] = {
        "apiVersion": m.API_VERSION,
        "kind": "Allocation",
        "id": allocation_id,
        "tenant": tenant,
        "sku": sku,
        "gpu_count": gpus,
        "region": region,
    }
    if image:
        doc["image"] = image
    doc["ssh_keys"] = ssh_keys
    if vm_profile:
        doc["vm_profile"] = vm_profile
    if lease_hours is not None:
        doc["lease_hours"] = lease_hours
    doc["state"] = m.AllocationState.PRESENT.value
    doc["requested_at"] = requested_at.astimezone(dt.UTC).replace(microsecond=0)
    buf = io.StringIO()
    buf.write("# Written by the portal bot. Set `state: released` to end the lease.\n")
    _yaml().dump(doc, buf)
    return buf.getvalue().encode()


# A document an allocation refers to. Unanchored, quotes optional: block YAML, flow YAML and JSON alike;
# a false match (a comment) only costs a parse.
_REFERENCED = re.compile(rb"""["']?\bkind["']?\s*:\s*["']?(?:Fleet|Sku|Image)\b""")


def relevant(name: str, data: safefiles.FileData, allocation_id: str) -> bool:
    """Whether the rules of allocation `allocation_id` need this file parsed.

    Unread files (links, FIFOs) stay in: they are errors of the repo as before.
    """
    if not isinstance(data, bytes):
        return True
    if allocation_id.encode() in data:
        return True
    # Plain substring tests first: bytes.find is a memchr scan, the pattern's optional quotes are not.
    return any(word in data for word in (b"Fleet", b"Sku", b"Image")) and _REFERENCED.search(data) is not None


def check_repo_with(root: Path, rel: str, data: bytes, allocation_id: str) -> list[p.Problem]:
    """Errors allocation `allocation_id` would have if `rel` held `data` (nothing is written)."""
    files = [
        (name, blob)
        for name, blob in safefiles.iter_directory(root)
        if name != rel and relevant(name, blob, allocation_id)
    ]
    files.append((rel, data))
    files.sort()
    result = validation.validate(loading.parse_files(files))
    return result.errors


def create(
    root: Path,
    *,
    tenant: str,
    sku: str,
    gpus: int,
    region: str,
    image: str | None = None,
    ssh_keys: list[str] | None = None,
    allocation_id: str | None = None,
    now: dt.datetime | None = None,
    commit: bool = False,
    push: tuple[str, str] | None = None,
    vm_profile: str | None = None,
    lease_hours: float | None = None,
) -> Written:
    now = now or dt.datetime.now(dt.UTC)
    allocation_id = allocation_id or new_id(now)
    rel = _request_file(allocation_id)
    if _existing(root, rel):
        raise PermanentError(f"{rel} already exists", code=reconciler_codes.REQUEST_EXISTS)
    data = render_request(
        allocation_id=allocation_id,
        tenant=tenant,
        sku=sku,
        gpus=gpus,
        region=region,
        image=image,
        ssh_keys=ssh_keys or [],
        requested_at=now,
        vm_profile=vm_profile,
        lease_hours=lease_hours,
    )
    errors = check_repo_with(root, rel, data, allocation_id)
    if errors:
        raise RequestRejected(errors)
    path = root / rel
    with _directory(root, rel, create=True) as parent:
        if parent is None:  # create=True makes every directory or raises
            raise PermanentError(f"no directory for {rel}", code=reconciler_codes.REQUEST_FILE)
        _create(parent, rel, data)
    if not commit:
        return Written(allocation_id, path, None)
    try:
        sha = _commit(root, path, f"request {allocation_id}: {gpus}x {sku} in {region} for {tenant}", push)
    except PermanentError as e:
        raise _undone(e, lambda: _remove(root, rel), f"writing {rel}") from e
    return Written(allocation_id, path, sha)


def release(root: Path, allocation_id: str, *, commit: bool = False, push: tuple[str, str] | None = None) -> Written:
    # The reader skips links (desired.file.symlink), so a linked request file would be
    # "not found"; the bot says what it refused instead.
    _existing(root, _request_file(allocation_id))
    rel = _find(root, allocation_id)
    path = root / rel
    with _directory(root, rel, create=False) as parent:
        if parent is None:
            raise PermanentError(f"{rel} is gone", code=reconciler_codes.REQUEST_NOT_FOUND)
        original, mode = _read_regular(parent, rel)
        y = _yaml()
        try:
            docs = list(y.load_all(original.decode("utf-8")))
        except (UnicodeDecodeError, YAMLError) as e:
            raise PermanentError(f"{rel} changed while it was read: {e}", code=reconciler_codes.REQUEST_FILE) from e
        for doc in docs:
            if isinstance(doc, dict) and doc.get("kind") == "Allocation" and doc.get("id") == allocation_id:
                doc["state"] = m.AllocationState.RELEASED.value
        buf = io.StringIO()
        y.dump_all(docs, buf)
        data = buf.getvalue().encode()
        errors = check_repo_with(root, rel, data, allocation_id)
        if errors:
            raise RequestRejected(errors)
        _replace(parent, rel, data, mode)
    if not commit:
        return Written(allocation_id, path, None)
    try:
        sha = _commit(root, path, f"release {allocation_id}", push)
    except PermanentError as e:
        raise _undone(e, lambda: _put_back(root, rel, original, mode), f"the change to {rel}") from e
    return Written(allocation_id, path, sha)


def _find(root: Path, allocation_id: str) -> str:
    result = loading.parse_files(
        (name, blob)
        for name, blob in safefiles.iter_directory(root)
        if isinstance(blob, bytes) and allocation_id.encode() in blob
    )
    src = result.state.sources.get(("Allocation", allocation_id))
    if src is None:
        raise PermanentError(f"no Allocation {allocation_id!r} in {root}", code=reconciler_codes.REQUEST_NOT_FOUND)
    return src.file


def _commit(root: Path, path: Path, message: str, push: tuple[str, str] | None) -> str:
    """Commit `path` as the bot (and push); on any failure, the branch and index are put back as they were.

    The caller puts the file itself back (`_undone`): a refused push leaves
    no local commit for the next run to push by surprise.

    The common path (add, commit, read HEAD) runs git itself: importing
    GitPython would cost more than the git commands a request runs.
    GitPython is loaded only to push or to undo.
    """
    top = _stdout(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, check=False, **_GIT))
    if top is None:
        raise PermanentError(f"git: {root} is not a git checkout", code=reconciler_codes.REQUEST_GIT)
    before = _stdout(subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=top, check=False, **_GIT))
    rel = str(path.resolve().relative_to(Path(top).resolve()))
    bot = {
        **os.environ,
        "GIT_AUTHOR_NAME": BOT_NAME,
        "GIT_AUTHOR_EMAIL": BOT_EMAIL,
        "GIT_COMMITTER_NAME": BOT_NAME,
        "GIT_COMMITTER_EMAIL": BOT_EMAIL,
    }
    try:
        # Only this path is committed (`-- rel`), as the bot.
        _checked(subprocess.run(["git", "add", "--", rel], cwd=top, check=False, **_GIT))
        _checked(
            subprocess.run(
                ["git", "commit", "-q", f"--message={message}", "--", rel], cwd=top, env=bot, check=False, **_GIT
            )
        )
        sha = _checked(subprocess.run(["git", "rev-parse", "HEAD"], cwd=top, check=False, **_GIT))
        if push is not None:
            _pushed(top, push)
        return sha
    except (PermanentError, subprocess.CalledProcessError, ValueError, OSError) as e:
        import git

        with git.Repo(top) as repo:  # its git processes end here
            left = _rolled_back(repo, before, rel)
        if isinstance(e, subprocess.CalledProcessError):
            why, code = f"git: {(e.stderr or '').strip() or e}", "request.git"
        else:
            why = e.message if isinstance(e, PermanentError) else f"git: {e}"
            code = e.code if isinstance(e, PermanentError) else reconciler_codes.REQUEST_GIT
        raise PermanentError(f"{why}; {left}", code=code) from e


_GIT: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 120}


def _stdout(done: subprocess.CompletedProcess[str]) -> str | None:
    """git's stripped stdout, or None where it failed."""
    return done.stdout.strip() if done.returncode == 0 else None


def _checked(done: subprocess.CompletedProcess[str]) -> str:
    """git's stripped stdout; CalledProcessError, with its stderr, where it failed."""
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout.strip()


def _pushed(top: str, push: tuple[str, str]) -> None:
    import git

    remote, branch = push
    try:
        with git.Repo(top) as repo:
            infos = repo.remote(remote).push(f"HEAD:refs/heads/{branch}")
    except git.GitCommandError as e:
        raise PermanentError(f"git: {e}", code=reconciler_codes.REQUEST_GIT) from e
    if any(i.flags & i.ERROR for i in infos):
        raise PermanentError(f"push to {remote}/{branch} was rejected", code=reconciler_codes.REQUEST_PUSH_REJECTED)


def _rolled_back(repo: git.Repo, before: str | None, rel: str) -> str:
    """Put the branch and the index entry of `rel` back to `before`; what was left, in words."""
    import git

    try:
        if before is None:
            if repo.head.is_valid():
                repo.git.update_ref("-d", "HEAD")
            repo.git.rm("--cached", "-q", "--ignore-unmatch", "--", rel)
        else:
            if repo.head.commit.hexsha != before:
                repo.head.reset(before, index=False, working_tree=False)  # the branch back, nothing else
            repo.index.reset(before, paths=[rel])  # and the file's index entry (the tree is put back by the caller)
    except (git.GitCommandError, ValueError) as e:
        return f"the local commit could not be undone ({e}): the branch may hold it; check `git log` before retrying"
    return "no local commit was left"


def _undone(error: PermanentError, restore: Callable[[], None], what: str) -> PermanentError:
    """`error`, once the working tree file is put back (`restore`), saying so or what was left."""
    try:
        restore()
    except (OSError, PermanentError) as e:
        return PermanentError(f"{error.message}; {what} could not be undone: {e}", code=error.code)
    return PermanentError(f"{error.message}; {what} was undone: the checkout is as it was", code=error.code)


def _request_file(allocation_id: str) -> str:
    if not _ID.match(allocation_id):
        raise PermanentError(
            f"allocation id {allocation_id!r} is not 3-63 lowercase letters, digits or '-'",
            code=reconciler_codes.REQUEST_ID,
        )
    return f"{ALLOCATIONS_DIR}/{allocation_id}.yaml"
