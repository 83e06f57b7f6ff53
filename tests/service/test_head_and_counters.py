"""What an operator pages on: HEAD applied or not (issue 26), and counters that only go up.

- an invalid HEAD (or one behind the applied revision, or failing) sets
  `gpuaas_head_applied 0` with how long, and /readyz answers 503
  `ready.head_unapplied` naming the commit and its first error once the
  grace is over; `gpuaas_reconciliation_failing` stays what it means;
- scrapes across several reconciliations, one of them in progress: every
  counter sample is >= the one before (a run in progress is a gauge), and
  `promtool check metrics` accepts the exposition.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.types.json import Jsonb

from reconciler import cli
from reconciler.store import connections, history, revisions
from tests.service.conftest import EXAMPLE, Served, serve

BAD = "b" * 40


def _record_invalid(url: str, revision: str, *, ago_s: float) -> None:
    """What the loop writes for an invalid commit on the watched branch (tests/gitops cover the loop itself)."""
    with connections.connect(url, autocommit=True) as conn:
        run_id = history.start(conn, revision=revision, source="apply watch:/repo")
        history.finish(
            conn,
            run_id,
            result="error",
            counts={revisions.INVALID_COUNT: 1},
            problems=[{"code": "desired.yaml.syntax", "message": "allocations/x.yaml:3: bad YAML"}],
        )
        conn.execute(
            "UPDATE reconciliations SET started_at = now() - make_interval(secs => %s) WHERE id = %s", (ago_s, run_id)
        )


def _metrics(s: Served) -> dict[str, float]:
    body = s.get("/metrics")[2].decode()
    return {
        f"{x.name}{sorted(x.labels.items())}": x.value for f in text_string_to_metric_families(body) for x in f.samples
    }


@pytest.fixture
def strict(fleet_url: str) -> Iterator[Served]:
    yield from serve(fleet_url, head_grace_s=60.0)


def test_an_invalid_head_pages_and_readyz_fails_after_the_grace(strict: Served, fleet_url: str) -> None:
    before = _metrics(strict)
    assert before["gpuaas_head_applied[]"] == 1 and before["gpuaas_head_unapplied_seconds[]"] == 0
    assert strict.get("/readyz")[0] == 200
    _record_invalid(fleet_url, BAD, ago_s=10)  # within the grace: not ready would flap on every commit
    m = _metrics(strict)
    assert m["gpuaas_head_applied[]"] == 0 and 9 <= m["gpuaas_head_unapplied_seconds[]"] < 600
    assert m["gpuaas_head_unapplied_since_seconds[]"] > 1.7e9
    assert m["gpuaas_reconciliation_failing[]"] == 0  # a refusal is not a failing loop
    assert strict.get("/readyz")[0] == 200
    with connections.connect(fleet_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE reconciliations SET started_at = started_at - interval '2 minutes' WHERE revision = %s", (BAD,)
        )
    doc = strict.json("/readyz", status=503)
    assert doc["error"]["code"] == "ready.head_unapplied"
    assert BAD[:12] in doc["error"]["message"] and "desired.yaml.syntax" in doc["error"]["message"]
    assert doc["checks"]["head"]["revision"] == BAD and doc["checks"]["head"]["applied"] is False


def test_status_and_the_dashboard_name_the_unapplied_head(fleet_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _record_invalid(fleet_url, BAD, ago_s=120)
    assert cli.main(["status", "--db-url", fleet_url]) == 0
    out = capsys.readouterr().out
    assert f"HEAD {BAD[:12]} NOT APPLIED" in out and "desired.yaml.syntax" in out
    for s in serve(fleet_url):
        page = s.get("/")[2].decode()
        assert 'id="head-unapplied"' in page and BAD[:12] in page and "desired.yaml.syntax" in page


def _counters(s: Served) -> tuple[dict[str, float], str]:
    body = s.get("/metrics")[2].decode()
    out = {}
    for family in text_string_to_metric_families(body):
        if family.type == "counter":
            for x in family.samples:
                if x.name.endswith("_total"):
                    out[f"{x.name}{sorted(x.labels.items())}"] = x.value
    return out, body


def test_counters_only_go_up_across_reconciliations(served: Served, fleet_url: str) -> None:
    scrapes = [_counters(served)]
    with connections.connect(fleet_url, autocommit=True) as conn:
        running = history.start(conn, revision="r" * 40, source="apply watch:/repo")  # in progress, alive
        scrapes.append(_counters(served))
        history.finish(conn, running, result="unchanged")
        scrapes.append(_counters(served))
    assert cli.main(["apply", str(EXAMPLE), "--db-url", fleet_url]) == 0
    scrapes.append(_counters(served))
    for (older, _), (newer, _) in itertools.pairwise(scrapes):
        went_down = {k: (v, newer.get(k)) for k, v in older.items() if newer.get(k, -1) < v}
        assert not went_down, went_down
    last_body = scrapes[-1][1]
    assert "gpuaas_reconciliations_running" in scrapes[1][1]
    assert 'result="running"' not in "".join(b for _, b in scrapes)
    assert "# TYPE gpuaas_provision_attempts_failed_total counter" in last_body
    assert 'gpuaas_provision_attempts_failed_total{outcome="failed"}' in last_body
    promtool = shutil.which("promtool")
    if promtool is not None:  # Debian's prometheus package (Makefile APT_PACKAGES)
        done = subprocess.run(
            [promtool, "check", "metrics"], input=last_body, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_malformed_host_error_report_shows_as_invalid_on_the_node_page(fleet_url: str) -> None:
    """Written before migration 0055 (the database now refuses it): the page says invalid, never 500."""
    with connections.connect(fleet_url, autocommit=True) as conn:
        node = conn.execute("SELECT node_name FROM host_status ORDER BY 1 LIMIT 1").fetchone()
        assert node is not None
        conn.execute("ALTER TABLE host_status DROP CONSTRAINT host_status_errors_shape")
        conn.execute(
            "UPDATE host_status SET errors = %s WHERE node_name = %s",
            (Jsonb([{"code": "host.vm.start", "message": "no step, no allocation"}]), node[0]),
        )
    for s in serve(fleet_url):
        status, _, body = s.get(f"/nodes/{node[0]}")
        page = body.decode()
        assert status == 200, page[:500]
        assert 'id="errors-invalid"' in page and "host.report.invalid" in page and "step" in page
