"""The console script ends `plan` and `validate` without freeing their trees (`reconciler.exiting`).

What the process printed and its exit status must be exactly what
`cli.main()` gives in-process: nothing lost to the skipped teardown.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import cli, exiting
from tests.gitops.conftest import Repo

pytestmark = pytest.mark.integration  # real git repositories and processes


def _process(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *args, "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _in_process(capsys: pytest.CaptureFixture[str], *args: str, cache: Path) -> tuple[int, str, str]:
    rc = cli.main([*args, "--cache-dir", str(cache)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(autouse=True)
def _disarmed(monkeypatch: pytest.MonkeyPatch) -> None:
    """cli.main() in this process arms the switch; it must not outlive the test."""
    monkeypatch.setattr(exiting, "_armed", False)


def test_a_plan_prints_all_of_its_output_and_its_status(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.request("req-1", 2)
    args = (
        "plan",
        str(fleet_repo.root),
        "--offline",
        "--base",
        "HEAD~1",
        "--head",
        "HEAD",
        "-o",
        "json",
        "--detailed-exitcode",
        "--no-cache",
    )
    got = _process(*args, cache=tmp_path / "a")
    rc, out, _ = _in_process(capsys, *args, cache=tmp_path / "b")
    assert (got.returncode, got.stdout) == (rc, out) == (2, out)
    assert '"req-1"' in got.stdout and got.stdout.endswith("}\n")
    assert "Traceback" not in got.stderr


def test_an_invalid_head_still_exits_1_with_every_problem(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet_repo.write("nodes/broken.yaml", "apiVersion: gpuaas.io/v1alpha1\nkind: Node\nname: broken\n")
    fleet_repo.commit("a broken node")
    for args in (
        ("validate", str(fleet_repo.root), "--rev", "HEAD"),
        ("plan", str(fleet_repo.root), "--offline", "--base", "HEAD~1", "--head", "HEAD"),
    ):
        got = _process(*args, cache=tmp_path / args[0])
        rc, out, err = _in_process(capsys, *args, cache=tmp_path / f"{args[0]}-in")
        assert got.returncode == rc == 1
        assert got.stdout == out
        assert "nodes/broken.yaml:" in got.stdout + got.stderr
        assert got.stderr.splitlines()[-1] == err.splitlines()[-1]


def test_a_reader_that_leaves_early_gets_no_traceback(fleet_repo: Repo, tmp_path: Path) -> None:
    fleet_repo.request("req-1", 2)
    plan = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "plan",
            str(fleet_repo.root),
            "--offline",
            "--base",
            "HEAD~1",
            "--head",
            "HEAD",
            "-o",
            "json",
            "--cache-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert plan.stdout is not None and plan.stderr is not None
    plan.stdout.read(1)
    plan.stdout.close()  # the reader leaves after one byte
    err = plan.stderr.read().decode()
    plan.stderr.close()
    assert plan.wait(timeout=120) in (0, 1, 2)
    assert "Traceback" not in err


def test_commands_that_do_not_arm_it_exit_normally() -> None:
    exiting._armed = False
    with pytest.raises(SystemExit) as e:
        exiting.finish(3)
    assert e.value.code == 3


def test_a_profiled_run_still_writes_its_profile(fleet_repo: Repo, tmp_path: Path) -> None:
    """cProfile writes at interpreter exit: under a profiler the exit is the normal one."""
    fleet_repo.request("req-1", 2)
    profile = tmp_path / "plan.prof"
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(profile),
            "-m",
            "reconciler.cli",
            "plan",
            str(fleet_repo.root),
            "--offline",
            "--base",
            "HEAD~1",
            "--head",
            "HEAD",
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    assert profile.stat().st_size > 0
