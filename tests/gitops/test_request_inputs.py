"""The portal bot never echoes a secret, never reads without bound, and a failed push leaves nothing (issue 27)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler import cli
from tests.gitops.conftest import Repo

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa acme@laptop"
CREATE = (
    "request",
    "create",
    "--tenant",
    "acme",
    "--sku",
    "h200-sxm-slice",
    "--gpus",
    "1",
    "--region",
    "us-east-1",
    "--id",
    "req-key",
)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    "content",
    [
        f"{KEY}\nroot:TOPSECRET:0:0:root:/root:/bin/bash\n",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAATOPSECRET\n-----END OPENSSH PRIVATE KEY-----\n",
    ],
)
def test_a_file_that_is_not_public_keys_is_refused_without_its_lines(
    fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    key = tmp_path / "id"
    key.write_text(content)
    for output in ("text", "json"):
        rc, out, err = _run(capsys, *CREATE, "--repo", str(fleet_repo.root), "--ssh-key", str(key), "-o", output)
        assert rc == 1
        assert "TOPSECRET" not in out + err and "b3Blbn" not in out + err
        assert "request.ssh_key.not_public" in out + err and "line(s)" in out + err
    assert not (fleet_repo.root / "allocations/req-key.yaml").exists()


def test_public_keys_are_taken(fleet_repo: Repo, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "id.pub"
    key.write_text(f"# laptop\n\n{KEY}\n")
    rc, _, err = _run(capsys, *CREATE, "--repo", str(fleet_repo.root), "--ssh-key", str(key))
    assert rc == 0, err
    assert KEY in (fleet_repo.root / "allocations/req-key.yaml").read_text()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process, at most 1 GiB of address space (an unbounded read dies, not the machine)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "reconciler.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        preexec_fn=limit,
    )


@pytest.mark.parametrize("kind", ["zero", "directory", "fifo", "big"])
def test_an_ssh_key_that_is_no_small_file_is_refused_without_a_traceback(
    fleet_repo: Repo, tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "key"
    if kind == "zero":
        path = Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(KEY + "\n" + "#" * (64 * 1024))
    done = _cli(*CREATE, "--repo", str(fleet_repo.root), "--ssh-key", str(path))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "error: request.ssh_key:" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("apply", "{fifo}"),
        ("simulate", "--fleet", "{repo}", "--workload", "{fifo}"),
    ],
)
def test_other_file_arguments_refuse_a_fifo(fleet_repo: Repo, tmp_path: Path, argv: tuple[str, ...]) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    done = _cli(*(a.format(fifo=fifo, repo=fleet_repo.root) for a in argv))
    assert done.returncode == 1 and "not a regular file" in done.stderr and "Traceback" not in done.stderr


def test_a_refused_push_leaves_the_checkout_as_it_was(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    fleet_repo.request("req-a")
    before = fleet_repo.repo.head.commit.hexsha
    fleet_repo.repo.create_remote("origin", str(fleet_repo.root.parent / "no-such-remote"))
    rc, out, err = _run(capsys, *CREATE, "--repo", str(fleet_repo.root), "--push", "-o", "json")
    assert rc == 1 and json.loads(out)["error"] == "request.git"
    assert "the checkout is as it was" in err
    assert fleet_repo.repo.head.commit.hexsha == before
    assert not fleet_repo.repo.is_dirty(untracked_files=True)
    rc, _, err = _run(capsys, "request", "release", "req-a", "--repo", str(fleet_repo.root), "--push")
    assert rc == 1 and "the checkout is as it was" in err
    assert fleet_repo.repo.head.commit.hexsha == before
    assert not fleet_repo.repo.is_dirty(untracked_files=True)
