"""Allocation requests as the portal bot writes them: one file per request, committed to git.

ruamel.yaml does the writing because a release must keep the file's comments
and key order (an operator may have annotated it). Validation runs on the
whole repo with the new bytes *before* anything is written or committed: an
invalid request never lands, and the bot gets the error codes back.
"""

from __future__ import annotations

import datetime as dt
import io
import secrets
from dataclasses import dataclass
from pathlib import Path

import git
from ruamel.yaml import YAML

from desired import loading
from desired import models as m
from desired import problems as p
from policies import validation
from reconciler.errors import PermanentError

BOT_NAME = "gpuaas-portal-bot"
BOT_EMAIL = "portal-bot@gpuaas.invalid"
ALLOCATIONS_DIR = "allocations"


class RequestRejected(PermanentError):
    """The request would make the repo invalid; nothing was written."""

    code = "request.invalid"

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
    doc["state"] = m.AllocationState.PRESENT.value
    doc["requested_at"] = requested_at.astimezone(dt.UTC).replace(microsecond=0)
    buf = io.StringIO()
    buf.write("# Written by the portal bot. Set `state: released` to end the lease.\n")
    _yaml().dump(doc, buf)
    return buf.getvalue().encode()


def check_repo_with(root: Path, rel: str, data: bytes) -> list[p.Problem]:
    """Errors the repo would have if `rel` held `data` (nothing is written)."""
    files = [(name, blob) for name, blob in loading.iter_directory(root) if name != rel]
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
) -> Written:
    now = now or dt.datetime.now(dt.UTC)
    allocation_id = allocation_id or new_id(now)
    rel = f"{ALLOCATIONS_DIR}/{allocation_id}.yaml"
    if (root / rel).exists():
        raise PermanentError(f"{rel} already exists", code="request.exists")
    data = render_request(
        allocation_id=allocation_id,
        tenant=tenant,
        sku=sku,
        gpus=gpus,
        region=region,
        image=image,
        ssh_keys=ssh_keys or [],
        requested_at=now,
    )
    errors = check_repo_with(root, rel, data)
    if errors:
        raise RequestRejected(errors)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    sha = (
        _commit(root, path, f"request {allocation_id}: {gpus}x {sku} in {region} for {tenant}", push)
        if commit
        else None
    )
    return Written(allocation_id, path, sha)


def release(root: Path, allocation_id: str, *, commit: bool = False, push: tuple[str, str] | None = None) -> Written:
    rel = _find(root, allocation_id)
    path = root / rel
    y = _yaml()
    docs = list(y.load_all(path.read_text()))
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == "Allocation" and doc.get("id") == allocation_id:
            doc["state"] = m.AllocationState.RELEASED.value
    buf = io.StringIO()
    y.dump_all(docs, buf)
    data = buf.getvalue().encode()
    errors = check_repo_with(root, rel, data)
    if errors:
        raise RequestRejected(errors)
    path.write_bytes(data)
    sha = _commit(root, path, f"release {allocation_id}", push) if commit else None
    return Written(allocation_id, path, sha)


def _find(root: Path, allocation_id: str) -> str:
    result = loading.parse_files(loading.iter_directory(root))
    src = result.state.sources.get(("Allocation", allocation_id))
    if src is None:
        raise PermanentError(f"no Allocation {allocation_id!r} in {root}", code="request.not_found")
    return src.file


def _commit(root: Path, path: Path, message: str, push: tuple[str, str] | None) -> str:
    try:
        repo = git.Repo(root, search_parent_directories=True)
        top = Path(repo.working_tree_dir or root)
        repo.index.add([str(path.resolve().relative_to(top.resolve()))])
        bot = git.Actor(BOT_NAME, BOT_EMAIL)
        sha = str(repo.index.commit(message, author=bot, committer=bot).hexsha)
        if push is not None:
            remote, branch = push
            infos = repo.remote(remote).push(f"HEAD:refs/heads/{branch}")
            if any(i.flags & i.ERROR for i in infos):
                raise PermanentError(f"push to {remote}/{branch} was rejected", code="request.push_rejected")
        return sha
    except (git.GitCommandError, git.InvalidGitRepositoryError, ValueError) as e:
        raise PermanentError(f"git: {e}", code="request.git") from e
