"""`gpuaas plan --offline` reads head by delta from base, and prints what a cold computation prints.

The command reads base whole, then head as base plus `git diff-tree`
base..head (`desired.reading.deltas`): only the files the PR changes are parsed and
validated, and the inventory diff compares only the documents the delta
names. Over a history of varied edits (allocations added, changed,
released; a drain; a node losing its slice tag; a slot map removed and
re-added; files renamed; an invalid head; a file that does not parse), and
over pairs where head does not descend from base, every output must be
byte for byte what planning two trees read whole prints. A second test
makes sure the delta is really taken, so a silent fall back to whole reads
fails.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import git
import pytest

from desired.reading import deltas, gitrepo
from desired.state import delta_since
from policies import validationmemo
from reconciler import cli, sources
from reconciler.caches import checkedtrees
from reconciler.caches.blobs import BlobCache
from reconciler.commands import plan as plan_command
from reconciler.placement import inventory_diff, prplan
from tests.gitops.conftest import NODES, Repo, make_fleet, make_loop

FORMATS = ("json", "markdown", "text")


@pytest.fixture
def fleet_repo(tmp_path: Path) -> Iterator[Repo]:
    """The conftest fleet plus a node in another region that no edit touches.

    us-east-1   h200-use1-s01, h200-use1-s02   (edited, planned onto)
    eu-west-1   h200-euw1-s01                  (never touched)
    """
    root = tmp_path / "desired"
    make_fleet(root, (*NODES, "h200-euw1-s01"))
    repo = Repo(root, git.Repo.init(root, initial_branch="main"))
    repo.commit("base fleet")
    yield repo
    repo.repo.close()


def _history(repo: Repo) -> list[str]:
    """Commits, each one edit after the last."""
    # The first is the bare fleet: req-a takes the first slot of an idle node (its mode changes).
    shas = [str(repo.repo.head.commit.hexsha)]
    shas += [repo.request("req-a", 1), repo.request("req-b", 2), repo.request("req-c", 1)]
    repo.edit("allocations/req-c.yaml", "gpu_count: 1", "gpu_count: 4")
    shas.append(repo.commit("req-c grows to 4 GPUs"))
    shas.append(repo.release("req-a"))
    shas.append(repo.drain("h200-use1-s01"))
    repo.edit("skus/h200-sxm-slice.yaml", "gpu_hourly_price_minor: 450", "gpu_hourly_price_minor: 500")
    shas.append(repo.commit("a SKU's price (every node reads the SKUs)"))
    repo.edit("fleet.yaml", "max_claim_attempts: 5", "max_claim_attempts: 4")
    shas.append(repo.commit("the Fleet document"))
    repo.edit("nodes/h200-use1-s02.yaml", "profile_tags: [gpuaas-profile-slice-vm]", "profile_tags: []")
    shas.append(repo.commit("s02 is no longer slice-tagged"))
    repo.edit("nodes/h200-use1-s02.yaml", "profile_tags: []", "profile_tags: [gpuaas-profile-slice-vm]")
    shas.append(repo.commit("s02 slice-tagged again"))
    slot_map = (repo.root / "slotmaps/h200-use1-s02.yaml").read_text()
    repo.remove("slotmaps/h200-use1-s02.yaml")
    shas.append(repo.commit("s02 slots withdrawn"))
    repo.write("slotmaps/h200-use1-s02.yaml", slot_map.replace('"52:54:d1:f8:71:cf"', '"52:54:d1:f8:71:ce"'))
    shas.append(repo.commit("s02 slots back, one MAC changed"))
    # Renames: the allocation moves after req-c in file order; the node file moves to a subfolder.
    repo.repo.git.mv("allocations/req-b.yaml", "allocations/zz-req-b.yaml")
    shas.append(repo.commit("req-b renamed"))
    (repo.root / "nodes/use1").mkdir()
    repo.repo.git.mv("nodes/h200-use1-s01.yaml", "nodes/use1/h200-use1-s01.yaml")
    shas.append(repo.commit("s01 moved to a folder"))
    shas.append(repo.request("req-d", 2))
    repo.edit("allocations/req-c.yaml", "gpu_count: 4", "gpu_count: 3")  # not an allowed count: head is invalid
    shas.append(repo.commit("req-c asks for 3 GPUs"))
    repo.edit("allocations/req-c.yaml", "gpu_count: 3", "gpu_count: 2")
    shas.append(repo.commit("req-c asks for 2 GPUs"))
    repo.write("allocations/broken.yaml", "kind: Allocation\nid: [unclosed\n")  # does not parse
    shas.append(repo.commit("a file that does not parse"))
    repo.remove("allocations/broken.yaml")
    shas.append(repo.commit("the broken file removed"))
    shas.append(repo.request("req-e", 1))
    return shas


def _pairs(shas: list[str]) -> list[tuple[str, str]]:
    """Each commit against the next, against the one two ahead, and the other way round (not a descendant)."""
    forward = list(itertools.pairwise(shas)) + list(zip(shas, shas[2:], strict=False))
    return forward + [(head, base) for base, head in forward[::3]] + [(shas[0], shas[-1])]


def _cold(root: Path, base: str, head: str) -> tuple[int, prplan.PrPlan]:
    """The exit status and plan of two trees each read whole, with nothing shared."""
    loaded_head = sources.load(root, head)
    if loaded_head.errors:
        return 1, prplan.invalid(base, loaded_head.state.revision, tuple(loaded_head.errors), offline=True)
    loaded_base = sources.load(root, base)
    assert delta_since(loaded_head.delta, loaded_base.state) is None  # really read whole
    pr = prplan.compose(
        loaded_base.state,
        loaded_head.state,
        prplan.offline_observed(loaded_base.state),
        offline=True,
        base_errors=tuple(loaded_base.errors),
    )
    # errors: an edit of an allocation base placed ("req-c grows to 4 GPUs", desired.allocation.immutable)
    return (1 if pr.errors else 2 if pr.changed else 0), pr


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["plan", *args])
    return rc, capsys.readouterr().out


def test_a_head_read_by_delta_plans_byte_for_byte_as_two_whole_reads(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shas = _history(fleet_repo)
    root = str(fleet_repo.root)
    seen = set()
    for base, head in _pairs(shas):
        rc, cold = _cold(fleet_repo.root, base, head)
        seen.add(rc)
        for fmt in FORMATS:
            want = (rc, plan_command._render(cold, fmt))
            flags = ("--offline", "--base", base, "--head", head, "-o", fmt, "--detailed-exitcode")
            assert _run(capsys, root, *flags, "--no-cache") == want, (base, head, fmt)
            # With the on-disk blob cache, holding what earlier runs parsed.
            assert _run(capsys, root, *flags, "--cache-dir", str(tmp_path / "cache")) == want, (base, head, fmt)
    assert seen == {0, 1, 2}  # the history covers no change, changes and an invalid head


def test_the_inventory_diff_by_delta_equals_the_whole_comparison(fleet_repo: Repo) -> None:
    shas = _history(fleet_repo)
    for base, head in _pairs(shas):
        reader = checkedtrees.Reader(BlobCache(), validationmemo.Memo())
        base_state = reader.load(fleet_repo.root, base).state
        by_delta = reader.load(fleet_repo.root, head).state
        whole = sources.load(fleet_repo.root, head).state
        assert inventory_diff.diff(base_state, by_delta) == inventory_diff.diff(base_state, whole), (base, head)
        ready = {"h200-use1-s01": False}  # observed firmware readiness overrides the node's
        assert inventory_diff.diff(base_state, by_delta, ready) == inventory_diff.diff(base_state, whole, ready), (
            base,
            head,
        )


def _whole_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The commits whose whole tree is listed from now on (a read by delta lists none)."""
    whole_reads: list[str] = []
    real_refs = gitrepo._refs

    def refs(repo: Any, commit: Any, prefix: str) -> Any:
        whole_reads.append(str(commit.hexsha))
        return real_refs(repo, commit, prefix)

    monkeypatch.setattr(gitrepo, "_refs", refs)
    return whole_reads


def test_head_is_read_by_delta_from_base(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fails when the command silently reads head whole, or compares every document."""
    base = fleet_repo.request("req-a", 1)
    fleet_repo.drain("h200-use1-s02")
    head = fleet_repo.request("req-b", 2)
    whole_reads = _whole_reads(monkeypatch)
    composed: list[tuple[Any, Any, Any]] = []
    made: list[prplan.PrPlan] = []
    real_compose = prplan.compose

    def compose(base_state: Any, head_state: Any, *args: Any, **kwargs: Any) -> Any:
        composed.append((base_state, head_state, kwargs.get("delta")))
        made.append(real_compose(base_state, head_state, *args, **kwargs))
        return made[-1]

    readers: list[checkedtrees.Reader] = []
    real_open = checkedtrees.open_reader

    def open_reader(args: Any) -> checkedtrees.Reader:
        readers.append(real_open(args))
        return readers[-1]

    compared: list[set[str] | None] = []
    real_capabilities = inventory_diff._capabilities

    def capabilities(state: Any, firmware: Any, only: set[str] | None = None) -> Any:
        compared.append(only)
        return real_capabilities(state, firmware, only)

    moded: list[set[str] | None] = []
    real_modes = prplan._modes

    def modes(engine: Any, only: set[str] | None = None) -> Any:
        moded.append(only)
        return real_modes(engine, only)

    monkeypatch.setattr(prplan, "_modes", modes)
    monkeypatch.setattr(prplan, "compose", compose)
    monkeypatch.setattr(checkedtrees, "open_reader", open_reader)
    monkeypatch.setattr(inventory_diff, "_capabilities", capabilities)
    rc, out = _run(
        capsys,
        str(fleet_repo.root),
        "--offline",
        "--base",
        base,
        "--head",
        head,
        "-o",
        "json",
        "--no-cache",
        "--detailed-exitcode",
    )
    assert rc == 2 and '"req-b"' in out
    assert whole_reads == [base]  # head came from git diff-tree, not a listing of its whole tree
    ((base_state, _head_state, read_by),) = composed
    delta = delta_since(read_by, base_state)
    assert delta is not None
    assert delta.keys == {("Node", "h200-use1-s02"), ("Allocation", "req-b")}
    assert readers[0].memo.by_delta == 1  # head's validation checked the delta's documents only
    assert compared == [{"h200-use1-s02"}, {"h200-use1-s02"}]  # capabilities of the drained node only
    # Modes of the drained node and of the node req-b is placed on, never of the untouched eu-west-1 node.
    placed = {pl.node for pl in made[0].plan.placements}
    assert moded == [{"h200-use1-s02"} | placed] * 2


def test_against_the_database_a_given_base_is_read_first_and_head_by_delta(
    fleet_repo: Repo, db_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Online with `--base`: the same output as two whole reads (the delta declined), and head read by delta."""
    base = fleet_repo.request("req-live", 2)
    run = make_loop(fleet_repo, db_url)  # req-live's claims are in the database
    run.step()
    run.loop.close()
    fleet_repo.drain("h200-use1-s01")
    head = fleet_repo.request("req-next", 4)
    whole_reads = _whole_reads(monkeypatch)
    flags = (
        str(fleet_repo.root),
        "--db-url",
        db_url,
        "--base",
        base,
        "--head",
        head,
        "-o",
        "json",
        "--detailed-exitcode",
        "--no-cache",
    )
    by_delta = _run(capsys, *flags)
    assert whole_reads == [base]
    assert by_delta[0] == 2 and '"req-next"' in by_delta[1]
    monkeypatch.setattr(deltas, "apply", lambda *_, **__: "declined for the test")
    assert _run(capsys, *flags) == by_delta
    assert whole_reads == [base, base, head]
