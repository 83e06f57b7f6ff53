"""A request nothing can take ends `failed` with `sku_unavailable` once past the pending deadline (real PostgreSQL).

The clock is the store's: the allocation's first-seen time is moved back,
so no test sleeps. The policy is the Fleet's, overridden per SKU.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

from desired import models as m
from policies import deadlines
from reconciler import cli
from reconciler.store import connections

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa t@t"


def test_the_deadline_is_a_pure_function_of_times_and_policy() -> None:
    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    placement = m.PlacementSettings(pending_deadline_seconds=60, pending_deadline_by_sku={"slow": 0, "fast": 10})
    assert deadlines.seconds_for(placement, "other") == 60 and deadlines.seconds_for(placement, "fast") == 10
    assert m.PlacementSettings().pending_deadline_seconds == 86_400  # the documented default
    late = t0 + dt.timedelta(seconds=60)
    assert deadlines.overdue(requested_at=t0, seen_at=t0, now=late, seconds=60)
    assert not deadlines.overdue(requested_at=t0, seen_at=t0, now=late, seconds=0)  # 0: never
    # first seen later than requested: the clock starts when the store saw it
    assert not deadlines.overdue(requested_at=t0, seen_at=t0 + dt.timedelta(seconds=30), now=late, seconds=60)


def test_an_unplaceable_request_fails_past_its_deadline(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, fleet)
    text = (fleet / "fleet.yaml").read_text()
    (fleet / "fleet.yaml").write_text(
        text.replace(
            "  max_claim_attempts: 5\n",
            "  max_claim_attempts: 5\n  pending_deadline_seconds: 0\n"
            "  pending_deadline_by_sku: {amd-mi300x-roce-slice: 600}\n",
        )
    )
    # MI300X in us-east-1, where no node has them: pending with a reason
    (fleet / "allocations" / "late-0001.yaml").write_text(
        "apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: late-0001\ntenant: hooli\n"
        "sku: amd-mi300x-roce-slice\ngpu_count: 4\nregion: us-east-1\n"
        f"ssh_keys:\n  - {KEY}\nstate: present\nrequested_at: 2026-11-20T09:00:00Z\n"
    )
    assert cli.main(["apply", str(fleet), "--db-url", db_url]) == 0
    with connections.connect(db_url, autocommit=True) as conn:
        status, code = conn.execute("SELECT status, pending_code FROM allocations WHERE id = 'late-0001'").fetchone()
        assert status == "pending" and code  # seen just now: inside its 600 s
        conn.execute("UPDATE allocations SET created_at = now() - interval '11 minutes'")
    capsys.readouterr()
    assert cli.main(["apply", str(fleet), "--db-url", db_url, "-o", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    with connections.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status, failure_code, failure_message FROM allocations WHERE id = 'late-0001'"
        ).fetchone()
        event = conn.execute(
            "SELECT payload FROM outbox WHERE aggregate_id = 'late-0001' AND event_type = 'allocation.failed'"
        ).fetchone()
        others = conn.execute(
            "SELECT count(*) FROM allocations WHERE status = 'failed' AND id <> 'late-0001'"
        ).fetchone()
    assert row[0] == "failed" and row[1] == "sku_unavailable" and code in row[2]
    assert event[0]["reasons"][0]["code"] == code and event[0]["deadline_s"] == 600
    assert others[0] == 0  # deadline 0 elsewhere: nothing else failed, however old
    assert "late-0001" in json.dumps(summary)
    # it stays failed: the next pass neither places it nor makes it pending again
    assert cli.main(["apply", str(fleet), "--db-url", db_url]) == 0
    with connections.connect(db_url, autocommit=True) as conn:
        assert conn.execute("SELECT status FROM allocations WHERE id = 'late-0001'").fetchone()[0] == "failed"
