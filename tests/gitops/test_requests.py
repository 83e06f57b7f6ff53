"""The portal bot: `gpuaas request create|release` against a real git repository."""

from __future__ import annotations

import json

import pytest

from reconciler import cli
from reconciler.reconcile import requests
from tests.gitops.conftest import Repo


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["request", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_create_commits_as_the_bot(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys,
        "create",
        "--repo",
        str(fleet_repo.root),
        "--tenant",
        "acme",
        "--sku",
        "h200-sxm-slice",
        "--gpus",
        "2",
        "--region",
        "us-east-1",
        "--id",
        "req-bot-1",
        "--commit",
        "-o",
        "json",
    )
    assert rc == 0
    doc = json.loads(out)
    head = fleet_repo.repo.head.commit
    assert doc["id"] == "req-bot-1" and doc["commit"] == head.hexsha
    assert (head.author.name, head.author.email) == (requests.BOT_NAME, requests.BOT_EMAIL)
    assert (head.committer.name, head.committer.email) == (requests.BOT_NAME, requests.BOT_EMAIL)
    assert list(head.stats.files) == ["allocations/req-bot-1.yaml"]
    assert not fleet_repo.repo.is_dirty(untracked_files=True)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("--gpus", "3", "--region", "us-east-1"), "desired.allocation.gpu_count"),
        (("--gpus", "1", "--region", "mars-1"), "desired.ref.unresolved"),
    ],
)
def test_invalid_request_is_never_committed_and_returns_the_code(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], code: str
) -> None:
    before = fleet_repo.repo.head.commit.hexsha
    rc, out, _ = _run(
        capsys,
        "create",
        "--repo",
        str(fleet_repo.root),
        "--tenant",
        "acme",
        "--sku",
        "h200-sxm-slice",
        "--id",
        "req-bad",
        "--commit",
        "-o",
        "json",
        *args,
    )
    assert rc == 1
    doc = json.loads(out)
    assert doc["error"] == requests.RequestRejected.code
    assert code in {p["code"] for p in doc["problems"]}
    assert all(p["file"] == "allocations/req-bad.yaml" for p in doc["problems"] if p["code"] == code)
    assert fleet_repo.repo.head.commit.hexsha == before
    assert not (fleet_repo.root / "allocations/req-bad.yaml").exists()
    assert not fleet_repo.repo.is_dirty(untracked_files=True)
    rc, _, err = _run(
        capsys,
        "create",
        "--repo",
        str(fleet_repo.root),
        "--tenant",
        "acme",
        "--sku",
        "h200-sxm-slice",
        "--id",
        "req-bad",
        "--commit",
        *args,
    )
    assert rc == 1 and f"{code}:" in err and "request.invalid" in err


def test_release_keeps_comments_and_key_order(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        "# Written by an operator for a demo.\n"
        "apiVersion: gpuaas.io/v1alpha1\n"
        "kind: Allocation\n"
        "id: req-annotated\n"
        "tenant: acme   # the customer\n"
        "region: us-east-1\n"
        "sku: h200-sxm-slice\n"
        "gpu_count: 1\n"
        "# keep until the end of the quarter\n"
        "state: present\n"
        "requested_at: 2026-11-01T08:00:00Z\n"
    )
    fleet_repo.write("allocations/req-annotated.yaml", text)
    fleet_repo.commit("an annotated request")
    rc, out, _ = _run(capsys, "release", "req-annotated", "--repo", str(fleet_repo.root), "--commit")
    assert rc == 0 and "released req-annotated" in out
    assert (fleet_repo.root / "allocations/req-annotated.yaml").read_text() == text.replace(
        "state: present", "state: released"
    )
    head = fleet_repo.repo.head.commit
    assert head.author.name == requests.BOT_NAME and list(head.stats.files) == ["allocations/req-annotated.yaml"]


def test_release_of_an_unknown_allocation_is_an_error(fleet_repo: Repo, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, "release", "req-nope", "--repo", str(fleet_repo.root), "--commit")
    assert rc == 1 and "request.not_found" in err


def _create(root: str, allocation_id: str, **extra: str) -> list[str]:
    argv = [
        "create",
        "--repo",
        root,
        "--tenant",
        "acme",
        "--sku",
        "h200-sxm-slice",
        "--gpus",
        "1",
        "--region",
        "us-east-1",
        "--id",
        allocation_id,
        "-o",
        "json",
    ]
    return argv + [x for k, v in extra.items() for x in (f"--{k}", v)]


def test_the_request_reads_the_files_its_rules_need_not_every_node(
    fleet_repo: Repo, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request is checked against the Fleet, SKUs, images and any file spelling its id; node files are not parsed.

    A SKU moved into a JSON-ish flow file in nodes/ is still found (the sniff is by kind, not directory), a
    second declaration of the id anywhere is still a duplicate, and a node file broken beyond parsing does not
    cost a tenant's request (CI reports it; parsing 4,000 such files made each request take seconds).
    """
    root = fleet_repo.root
    sku = (root / "skus/h200-sxm-slice.yaml").read_text()
    (root / "skus/h200-sxm-slice.yaml").unlink()
    (root / "nodes/zz-sku.yaml").write_text(sku.replace("kind: Sku", 'kind: "Sku"'))
    (root / "nodes/broken.yaml").write_text("kind: Node\nname: [unclosed\n")
    rc, out, _ = _run(capsys, *_create(str(root), "req-ok-1"))
    assert rc == 0, out

    (root / "nodes/elsewhere.yaml").write_text(
        (root / "allocations/req-ok-1.yaml").read_text().replace("req-ok-1", "req-dup-1")
    )
    rc, out, _ = _run(capsys, *_create(str(root), "req-dup-1"))
    assert rc == 1
    assert "duplicate" in json.dumps(json.loads(out)["problems"])
    assert not (root / "allocations/req-dup-1.yaml").exists()
