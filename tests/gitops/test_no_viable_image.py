"""`plan` and `apply` leave a request with no viable image pending (seed 002 §4; issue 26).

Regression: with no usable image in the repo, `plan` placed the request with
`"image": null`, and the host then failed it with `host.image.none`.
"""

from __future__ import annotations

import json

import pytest

from reconciler import cli
from reconciler.store import connections
from tests.gitops.conftest import Repo, allocation_status, claims


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_no_image_no_placement(
    fleet_repo: Repo, db_url: str, conn: connections.Connection, capsys: pytest.CaptureFixture[str]
) -> None:
    for image in ("h200-ubuntu-24.04-gpuaas-slice", "ubuntu-24.04-gpuaas-slice", "ubuntu-24.04-maas"):
        fleet_repo.remove(f"images/{image}.yaml")
    fleet_repo.commit("no images")
    fleet_repo.request("alloc-0001", 1)
    rc, out, _ = _cli(capsys, "plan", str(fleet_repo.root), "--offline", "-o", "json", "--no-cache")
    assert rc == 0
    doc = json.loads(out)
    assert doc["placements"] == []
    (pending,) = doc["pending"]
    assert (pending["allocation_id"], pending["code"]) == ("alloc-0001", "plan.image_unavailable")
    assert pending["details"] == {"image": None, "why": "none", "target": "vm_slice"}

    assert _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 0
    assert allocation_status(conn, "alloc-0001") == ("pending", "plan.image_unavailable")
    assert claims(conn, "alloc-0001") == []

    # an image arrives: placed with it
    fleet_repo.repo.git.checkout("HEAD~2", "--", "images")
    fleet_repo.commit("images back")
    assert _cli(capsys, "apply", str(fleet_repo.root), "--db-url", db_url)[0] == 0
    row = conn.execute("SELECT status, placement ->> 'image' FROM allocations WHERE id = 'alloc-0001'").fetchone()
    assert row is not None and row[0] == "reserved"
