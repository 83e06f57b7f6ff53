"""`--log-format json` on the long-running commands: every line a JSON object with time, level and event.

The host agent's lines are checked in tests/host/test_agent_metrics.py (it needs a lab host).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import git
import pytest

from schemas import logs
from schemas.errors import UsageError
from tests.gitops.conftest import PEOPLE, make_fleet

ROOT = Path(__file__).resolve().parents[2]


def parse_json_lines(text: str) -> list[dict[str, object]]:
    """Every non-empty line parsed as one JSON log object with the keys the contract promises."""
    docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    for doc in docs:
        assert {"time", "level", "event", "message"} <= doc.keys(), doc
        assert str(doc["time"]).endswith("+00:00") and doc["level"] in ("debug", "info", "warning", "error")
    return docs


def test_run_once_logs_one_json_object_per_line(tmp_path: Path, db_url: str) -> None:
    root = tmp_path / "desired"
    make_fleet(root)
    repo = git.Repo.init(root, initial_branch="main")
    repo.git.add("-A")
    sha = repo.index.commit("base fleet", author=PEOPLE, committer=PEOPLE).hexsha
    env = {**os.environ, logs.ENV: "json"}  # the variable alone selects JSON
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "run", str(root), "--once", "--db-url", db_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out, err = parse_json_lines(done.stdout), parse_json_lines(done.stderr)
    assert not err
    events = [d["event"] for d in out]
    assert events[0] == "run.started" and "reconcile.applied" in events, events
    applied = next(d for d in out if d["event"] == "reconcile.applied")
    assert applied["revision"] == sha and applied["level"] == "info" and isinstance(applied["run_id"], int)
    assert applied["changed"] is True and isinstance(applied["counts"], dict)


def test_run_text_lines_keep_their_shape(tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from reconciler import cli

    root = tmp_path / "desired"
    make_fleet(root)
    repo = git.Repo.init(root, initial_branch="main")
    repo.git.add("-A")
    repo.index.commit("base fleet", author=PEOPLE, committer=PEOPLE)
    before = list(logging.getLogger(logs.ROOT).handlers)  # pytest's capture may hang its own there
    assert cli.main(["run", str(root), "--once", "--db-url", db_url, "--log-format", "text"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(" applied " in f" {line} " for line in lines), lines
    for line in lines:  # `2026-11-25T08:34:25.123Z text`, as before
        stamp = line.split(" ", 1)[0]
        assert len(stamp) == 24 and stamp.endswith("Z") and stamp[10] == "T", line
    assert logging.getLogger(logs.ROOT).handlers == before  # the command took its handler off


def test_an_unknown_format_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.ENV, "yaml")
    with pytest.raises(UsageError) as e:
        logs.choose(None)
    assert e.value.code == "cli.log_format_unknown"
    assert logs.choose("text") == "text"  # the flag wins over the variable


def test_json_formatter_carries_extra_fields_and_handler_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with logs.configured("json", defaults={"node": "n1"}):
        logging.getLogger("gpuaas.test").warning(
            "slot %d blocked", 3, extra={"event": "slot.blocked", "allocation": "a-1", "node": "n2"}
        )
        logging.getLogger("gpuaas.test").info("plain")
    first, second = parse_json_lines(capsys.readouterr().err)
    assert first == {
        **first,
        "event": "slot.blocked",
        "level": "warning",
        "message": "slot 3 blocked",
        "allocation": "a-1",
        "node": "n2",
    }  # the call's node wins over the default
    assert second["event"] == "gpuaas.test" and second["node"] == "n1" and "allocation" not in second
