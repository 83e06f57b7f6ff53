"""The content hash of a read tree comes from git's blob ids, not from serialising every model.

`inventoryrows.content_hash` names the desired state a revision synced
(`desired_revisions.content_hash`, a saved plan's `desired_hash`, the
`tree:` revision of a plain directory). A document read from a file is named
by its file's blob id and its place in the file; only a model that no
document typed (a state edited in code) is dumped.
"""

from __future__ import annotations

import copy

import pytest
from pydantic import BaseModel

from desired import models as m
from desired.state import DesiredState
from reconciler import sources
from reconciler.store import inventoryrows
from tests.gitops.conftest import Repo


def _read(repo: Repo, rev: str | None = "HEAD") -> DesiredState:
    loaded = sources.load(repo.root, rev)
    assert not loaded.errors, [e.render() for e in loaded.errors]
    return loaded.state


def test_a_read_tree_is_hashed_without_dumping_a_model(fleet_repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    state = _read(fleet_repo)

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("content_hash serialised a model the reader typed from a blob")

    monkeypatch.setattr(BaseModel, "model_dump", refuse)
    assert len(inventoryrows.content_hash(state)) == 64


def test_git_and_directory_reads_of_one_tree_hash_alike(fleet_repo: Repo) -> None:
    # `gpuaas plan` and `gpuaas apply` may read the same tree either way; a saved plan must still match.
    assert inventoryrows.content_hash(_read(fleet_repo)) == inventoryrows.content_hash(_read(fleet_repo, None))


def test_the_hash_follows_every_document(fleet_repo: Repo) -> None:
    before = _read(fleet_repo)
    digest = inventoryrows.content_hash(before)
    assert inventoryrows.content_hash(_read(fleet_repo)) == digest  # the same tree read again

    fleet_repo.drain("h200-use1-s01")
    drained = inventoryrows.content_hash(_read(fleet_repo))
    assert drained != digest

    # A comment changes the file's blob, so the hash too (a new commit is a new revision anyway).
    fleet_repo.edit("skus/h200-sxm-slice.yaml", "\n", "\n# reviewed\n")
    fleet_repo.commit("a comment")
    assert inventoryrows.content_hash(_read(fleet_repo)) != drained

    # A state edited in code holds a model no document typed: it is hashed by its content.
    edited = copy.copy(before)
    node = before.nodes["h200-use1-s02"]
    edited.nodes = {**before.nodes, node.name: node.model_copy(update={"admin_state": m.AdminState.DRAINING})}
    assert inventoryrows.content_hash(edited) != digest
    assert inventoryrows.content_hash(copy.copy(before)) == digest


def test_a_kept_hash_resumes_after_unchanged_tables_and_equals_a_fresh_one(fleet_repo: Repo) -> None:
    """The loop's memory hashes only the tables from the first changed kind on (`_digest`)."""
    from reconciler.caches.blobs import BlobCache
    from reconciler.store import inventory

    cache, memory = BlobCache(keep_values=False), inventory.Memory()

    def kept() -> str:
        loaded = sources.load(fleet_repo.root, fleet_repo.repo.head.commit.hexsha, cache=cache)
        assert not loaded.errors
        warm = inventoryrows.content_hash(loaded.state, memory, loaded.delta)
        assert warm == inventoryrows.content_hash(loaded.state)
        return warm

    seen = [kept()]
    fleet_repo.request("req-hash", 1)  # the last table only: the hasher resumes after slot maps
    seen.append(kept())
    assert memory.hash_states["slot_maps"][0] is memory.hash_parts["slot_maps"]
    fleet_repo.drain("h200-use1-s01")  # a node: nodes, slot maps and allocations hashed again
    seen.append(kept())
    fleet_repo.edit("skus/h200-sxm-slice.yaml", "\n", "\n# reviewed\n")
    fleet_repo.commit("a comment")
    seen.append(kept())
    assert len(set(seen)) == 4
