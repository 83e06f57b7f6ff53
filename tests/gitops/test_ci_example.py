"""examples/ci: the GitHub Actions workflow validates and posts `gpuaas plan -o markdown` on every PR.

The workflow is parsed, its steps checked, and its own `gpuaas validate` and
`gpuaas plan` command lines are run against a real repository with a PR
branch and an `origin/main` base.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from reconciler import cli
from tests.gitops.conftest import Repo

WORKFLOW = Path(__file__).resolve().parents[2] / "examples" / "ci" / "gpuaas-pr.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    (job,) = workflow["jobs"].values()
    return list(job["steps"])


def _command(workflow: dict[str, Any], prefix: str) -> list[str]:
    """The shell line of the workflow that starts with `prefix`, as argv (redirections cut off)."""
    for step in _steps(workflow):
        for line in str(step.get("run", "")).splitlines():
            if line.strip().startswith(prefix):
                argv = shlex.split(line.replace("${BASE_REF}", "main"))
                return argv[: argv.index(">")] if ">" in argv else argv
    raise AssertionError(f"no step runs {prefix!r}")


def test_workflow_runs_on_pull_requests_and_may_comment(workflow: dict[str, Any]) -> None:
    triggers: Any = workflow["on"] if "on" in workflow else workflow[True]  # type: ignore[index]  # YAML 1.1: on=true
    assert "pull_request" in triggers
    assert workflow["permissions"]["pull-requests"] == "write"
    uses = [s.get("uses", "") for s in _steps(workflow)]
    assert any(u.startswith("actions/checkout@") for u in uses)
    checkout = next(s for s in _steps(workflow) if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["fetch-depth"] == 0  # the base branch is needed for --base
    assert any("pip install" in str(s.get("run", "")) for s in _steps(workflow))


def test_workflow_validates_plans_and_posts_the_markdown(workflow: dict[str, Any]) -> None:
    assert _command(workflow, "gpuaas validate") == ["gpuaas", "validate", "."]
    plan = _command(workflow, "gpuaas plan")
    assert plan[:2] == ["gpuaas", "plan"]
    for flag, value in (("-o", "markdown"), ("--base", "origin/main"), ("--head", "HEAD")):
        assert plan[plan.index(flag) + 1] == value
    assert "--offline" in plan and "--detailed-exitcode" in plan and "--fail-on-pending" in plan
    comment = next(s for s in _steps(workflow) if s.get("uses", "").startswith("actions/github-script@"))
    script = comment["with"]["script"]
    assert "plan.md" in script and "<!-- gpuaas-plan -->" in script
    assert "createComment" in script and "updateComment" in script


def test_workflow_commands_run_against_a_real_pr(
    workflow: dict[str, Any], fleet_repo: Repo, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    main = fleet_repo.repo.head.commit.hexsha
    fleet_repo.repo.git.update_ref("refs/remotes/origin/main", main)  # what checkout with fetch-depth 0 leaves
    fleet_repo.repo.git.checkout("-b", "pr")
    fleet_repo.request("req-ci", 4)
    monkeypatch.chdir(fleet_repo.root)
    assert cli.main(_command(workflow, "gpuaas validate")[1:]) == 0
    capsys.readouterr()
    assert cli.main(_command(workflow, "gpuaas plan")[1:]) == 2
    md = capsys.readouterr().out
    assert md.startswith("<!-- gpuaas-plan -->\n") and "`req-ci`" in md


def _index(workflow: dict[str, Any], predicate: Any) -> int:
    return next(i for i, s in enumerate(_steps(workflow)) if predicate(s))


def test_the_plan_comment_is_posted_before_anything_fails(workflow: dict[str, Any]) -> None:
    plan = _index(workflow, lambda s: s.get("id") == "plan")
    comment = _index(workflow, lambda s: s.get("uses", "").startswith("actions/github-script@"))
    validate = _index(workflow, lambda s: "gpuaas validate" in str(s.get("run", "")))
    gate = _index(workflow, lambda s: "PLAN_EXIT" in str(s.get("run", "")))
    assert plan < comment < validate and comment < gate
    steps = _steps(workflow)
    assert "exit 1" not in steps[plan]["run"]  # the plan step never fails: the comment must follow
    assert steps[comment]["if"].startswith("always()") and steps[gate]["if"].startswith("always()")


@pytest.mark.parametrize(("plan_exit", "job_passes"), [("0", True), ("2", True), ("1", False), ("3", False)])
def test_the_gate_fails_the_job_on_invalid_and_pending_only(
    workflow: dict[str, Any], plan_exit: str, job_passes: bool
) -> None:
    gate = next(s for s in _steps(workflow) if "PLAN_EXIT" in str(s.get("run", "")))
    done = subprocess.run(
        ["bash", "-e", "-c", gate["run"]],
        env={**os.environ, "PLAN_EXIT": plan_exit},
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert (done.returncode == 0) is job_passes
    assert job_passes or "::error::" in done.stdout


def _pr(fleet_repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet_repo.repo.git.update_ref("refs/remotes/origin/main", fleet_repo.repo.head.commit.hexsha)
    fleet_repo.repo.git.checkout("-b", "pr")
    monkeypatch.chdir(fleet_repo.root)


def test_an_over_subscribing_pr_gets_its_comment_and_fails(
    workflow: dict[str, Any], fleet_repo: Repo, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five 8-GPU requests where two hosts fit two: exit 3, and the markdown names the three left pending."""
    _pr(fleet_repo, monkeypatch)
    for i in range(5):
        fleet_repo.request(f"req-8g-{i}", 8)
    capsys.readouterr()
    assert cli.main(_command(workflow, "gpuaas plan")[1:]) == 3
    out = capsys.readouterr()
    assert out.out.startswith("<!-- gpuaas-plan -->\n") and "| Allocations pending | 3 (3 new) |" in out.out
    assert "error: plan.pending: 3 request(s) this change adds or alters would stay pending" in out.err
    # Without the flag the same PR would have passed green (exit 2: changes).
    assert cli.main([a for a in _command(workflow, "gpuaas plan")[1:] if a != "--fail-on-pending"]) == 2


def test_an_invalid_pr_still_gets_its_invalid_comment(
    workflow: dict[str, Any], fleet_repo: Repo, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _pr(fleet_repo, monkeypatch)
    fleet_repo.write("allocations/broken.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: broken\n")
    fleet_repo.commit("a broken request")
    capsys.readouterr()
    assert cli.main(_command(workflow, "gpuaas plan")[1:]) == 1
    md = capsys.readouterr().out
    assert md.startswith("<!-- gpuaas-plan -->\n") and "**Invalid:" in md
    assert "| `allocations/broken.yaml:1:1` | `desired.field.missing` |" in md  # FILE:LINE:COL once per row
    assert cli.main(_command(workflow, "gpuaas validate")[1:]) == 1
