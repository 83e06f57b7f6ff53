"""Typos get "did you mean", not a list of every choice; CLI JSON times are ISO 8601 (issue 34)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from reconciler import cli
from schemas import output


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["aplly"], "invalid choice: 'aplly'; did you mean 'apply'?"),
        (["host", "imgae"], "did you mean 'image'"),
        (["validate", "-o", "jsno"], "invalid choice: 'jsno'; did you mean 'json'?"),
        (["validate", "--outptu", "json"], "--outptu: did you mean '--output'?"),
        (["plan", "--detailed-exticode"], "--detailed-exticode: did you mean '--detailed-exitcode'?"),
    ],
)
def test_a_typo_names_what_was_meant(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "choose from" not in err  # the one meant, not the twenty there are


def test_nothing_close_still_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["zzzzqqq"])
    err = capsys.readouterr().err
    assert "choose from" in err and "did you mean" not in err


def test_times_are_iso_8601_with_a_t() -> None:
    at = dt.datetime(2026, 11, 27, 13, 38, 5, tzinfo=dt.UTC)
    doc = {"at": at, "day": at.date()}
    assert json.loads(output.dumps(doc, "json")) == {"at": "2026-11-27T13:38:05+00:00", "day": "2026-11-27"}
    assert "2026-11-27T13:38:05+00:00" in output.dumps(doc, "yaml")
