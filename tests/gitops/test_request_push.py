"""The portal bot's push (GitPython, loaded only to push or undo): a refused push leaves nothing behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reconciler.reconcile import requests
from schemas.errors import PermanentError
from tests.gitops.conftest import Repo


def test_a_rejected_push_undoes_the_commit_and_the_file(fleet_repo: Repo, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho refused >&2\nexit 1\n")
    hook.chmod(0o755)
    subprocess.run(["git", "-C", str(fleet_repo.root), "remote", "add", "origin", str(remote)], check=True)
    before = fleet_repo.repo.head.commit.hexsha
    with pytest.raises(PermanentError) as caught:
        requests.create(
            fleet_repo.root,
            tenant="acme",
            sku="h200-sxm-slice",
            gpus=2,
            region="us-east-1",
            allocation_id="req-push-1",
            commit=True,
            push=("origin", "main"),
        )
    assert caught.value.code == "request.push_rejected" and "no local commit was left" in caught.value.message
    assert fleet_repo.repo.head.commit.hexsha == before
    assert not (fleet_repo.root / "allocations" / "req-push-1.yaml").exists()
    assert not fleet_repo.repo.is_dirty(untracked_files=True)


def test_outside_a_checkout_the_commit_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as caught:
        requests._commit(tmp_path, tmp_path / "x.yaml", "m", None)
    assert caught.value.code == "request.git"
