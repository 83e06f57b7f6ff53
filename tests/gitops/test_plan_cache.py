"""`gpuaas plan --offline` replays a finished plan of the same two commits (`reconciler.caches.planresults`).

The replay must print exactly what planning from scratch prints and exit
the same way, over a history of varied edits; an entry that is damaged,
foreign or made by other code is ignored and the plan computed again.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from reconciler import cli, sources
from reconciler.caches import planresults
from reconciler.caches.blobs import BlobCache
from reconciler.commands import plan as plan_command
from reconciler.placement import capacity, placing, prplan, prplan_render, replanning
from tests.gitops.conftest import Repo

FORMATS = ("json", "markdown", "text")
ALLOCATION = "allocations/req-c.yaml"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _history(repo: Repo) -> list[str]:
    """Commits, each one edit after the last: add, change, release, drain, slot maps, an invalid file."""
    shas = [repo.request("req-a", 1), repo.request("req-b", 2), repo.request("req-c", 1)]
    repo.edit(ALLOCATION, "gpu_count: 1", "gpu_count: 4")
    shas.append(repo.commit("req-c grows to 4 GPUs"))
    shas.append(repo.release("req-a"))
    shas.append(repo.drain("h200-use1-s01"))
    slot_map = (repo.root / "slotmaps/h200-use1-s02.yaml").read_text()
    repo.remove("slotmaps/h200-use1-s02.yaml")
    shas.append(repo.commit("s02 slots withdrawn"))
    repo.write("slotmaps/h200-use1-s02.yaml", slot_map.replace('"52:54:d1:f8:71:cf"', '"52:54:d1:f8:71:ce"'))
    shas.append(repo.commit("s02 slots back, one MAC changed"))
    repo.edit(ALLOCATION, "gpu_count: 4", "gpu_count: 3")  # not an allowed count: head is invalid
    shas.append(repo.commit("req-c asks for 3 GPUs"))
    return shas


def _forbid_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("planned although the cache holds this plan")

    monkeypatch.setattr(plan_command, "_plan", refuse)


def _count_planning(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    planned: list[int] = []
    real = plan_command._plan

    def counted(*args: Any) -> Any:
        planned.append(1)
        return real(*args)

    monkeypatch.setattr(plan_command, "_plan", counted)
    return planned


def test_replayed_plans_equal_plans_from_scratch(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = _history(fleet_repo)
    cache = str(tmp_path / "cache")
    root = str(fleet_repo.root)
    cases = [(base, head, fmt) for base, head in itertools.pairwise(shas) for fmt in FORMATS]
    cold = {}
    for base, head, fmt in cases:
        flags = ("--offline", "--base", base, "--head", head, "-o", fmt, "--detailed-exitcode", "--fail-on-pending")
        cold[base, head, fmt] = _run(capsys, root, *flags, "--no-cache")
        assert _run(capsys, root, *flags, "--cache-dir", cache) == cold[base, head, fmt]
    assert {rc for rc, _, _ in cold.values()} >= {1, 2}  # the history covers changes and an invalid head
    _forbid_planning(monkeypatch)
    for base, head, fmt in cases:
        flags = ("--offline", "--base", base, "--head", head, "-o", fmt, "--detailed-exitcode", "--fail-on-pending")
        assert _run(capsys, root, *flags, "--cache-dir", cache) == cold[base, head, fmt], (base, head, fmt)


@pytest.mark.parametrize("damage", ["payload", "mac", "key"])
def test_a_damaged_or_foreign_entry_is_planned_again(
    fleet_repo: Repo, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = fleet_repo.request("req-a", 1)
    head = fleet_repo.request("req-b", 2)
    cache = tmp_path / "cache"
    flags = (str(fleet_repo.root), "--offline", "--base", base, "--head", head, "-o", "json")
    want = _run(capsys, *flags, "--no-cache")
    assert _run(capsys, *flags, "--cache-dir", str(cache)) == want
    if damage == "key":  # another user's (or a wiped) key: every entry is foreign
        (cache / "key").unlink()
    else:
        with sqlite3.connect(cache / "blobs.sqlite3") as db:
            (payload,) = db.execute("SELECT payload FROM results").fetchone()
            forged = payload.replace(b"req-b", b"req-x") if damage == "payload" else None
            if forged is not None:
                db.execute("UPDATE results SET payload = ?", (forged,))
            else:
                db.execute("UPDATE results SET mac = zeroblob(32)")
    planned = _count_planning(monkeypatch)
    assert _run(capsys, *flags, "--cache-dir", str(cache)) == want
    assert planned == [1]


def test_other_code_or_a_saved_plan_is_never_replayed(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = fleet_repo.request("req-a", 1)
    head = fleet_repo.request("req-b", 2)
    flags = (str(fleet_repo.root), "--offline", "--base", base, "--head", head, "--cache-dir", str(tmp_path / "c"))
    first = _run(capsys, *flags)
    planned = _count_planning(monkeypatch)
    out = tmp_path / "plan.json"
    rc, _, err = _run(capsys, *flags, "--out", str(out))  # the saved plan needs head: planned again
    assert rc == 0 and out.exists() and "plan saved" in err and planned == [1]
    monkeypatch.setattr(planresults, "code_version", lambda: "another build")
    assert _run(capsys, *flags) == first
    assert planned == [1, 1]


def test_the_command_equals_a_plan_composed_cold(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    """The command shares one warm engine (and the blob cache) between base and head; a plain compose does not."""

    shas = _history(fleet_repo)
    for base, head in itertools.pairwise(shas):
        rc, out, _ = _run(
            capsys, str(fleet_repo.root), "--offline", "--base", base, "--head", head, "-o", "json", "--no-cache"
        )
        loaded_head = sources.load(fleet_repo.root, head)
        if loaded_head.errors:
            assert rc == 1
            continue
        base_state = sources.load(fleet_repo.root, base).state
        cold = prplan.compose(base_state, loaded_head.state, prplan.offline_observed(base_state), offline=True)
        assert json.loads(out) == json.loads(json.dumps(prplan_render.as_dict(cold), default=str)), (base, head)


def test_a_read_model_reusing_the_base_memo_equals_one_built_fresh(fleet_repo: Repo) -> None:
    """Head's capacity read model takes base's per-node parts for the nodes a PR leaves alone."""

    shas = _history(fleet_repo)[:-1]  # the last head is invalid
    cache = BlobCache()  # shared, as the command shares it: unchanged nodes are the same objects
    for base, head in itertools.pairwise(shas):
        base_state = sources.load(fleet_repo.root, base, cache=cache).state
        head_state = sources.load(fleet_repo.root, head, cache=cache).state
        observed = prplan.offline_observed(base_state)
        observed_after = prplan.after(observed, replanning.WarmPlanner()(head_state, observed))
        memo = capacity.Memo()
        warm = replanning.WarmPlanner()
        capacity.read_model(base_state, observed, engine=warm.engine(base_state, observed), memo=memo)
        reused = capacity.read_model(
            head_state, observed_after, engine=warm.engine(head_state, observed_after), memo=memo
        )
        assert reused == capacity.read_model(
            head_state, observed_after, engine=placing.Engine(head_state, observed_after)
        )
        assert memo.summaries and memo.slices


def test_the_code_version_reads_every_python_source_of_the_packages(tmp_path: Path) -> None:
    """What `code_version` hashes: each `.py` under a package, however deep, and nothing else."""
    for rel in ("pkg/a.py", "pkg/sub/b.py", "pkg/sub/deeper/c.py", "pkg/notes.md", "pkg/a.pyc", "other/d.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    (tmp_path / "pkg" / "link").symlink_to(tmp_path / "other", target_is_directory=True)  # not followed
    assert sorted(planresults._sources(str(tmp_path), "pkg")) == ["pkg/a.py", "pkg/sub/b.py", "pkg/sub/deeper/c.py"]
    root = Path(planresults.__file__).resolve().parents[2]
    mine = {str(p.relative_to(root)) for pkg in planresults._PACKAGES for p in (root / pkg).rglob("*.py")}
    assert {rel for pkg in planresults._PACKAGES for rel in planresults._sources(str(root), pkg)} == mine


def test_the_plan_runs_without_cyclic_collection_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Imports and planning make long-lived objects only: the collector is off while they run, on after."""
    import gc

    seen: list[bool] = []

    def fake(_args: Any) -> int:
        seen.append(gc.isenabled())
        if len(seen) == 2:
            raise RuntimeError("boom")
        return 0

    monkeypatch.setattr(plan_command, "_run", fake)
    assert gc.isenabled()
    assert plan_command.run(argparse.Namespace()) == 0
    with pytest.raises(RuntimeError):
        plan_command.run(argparse.Namespace())
    assert seen == [False, False] and gc.isenabled()
