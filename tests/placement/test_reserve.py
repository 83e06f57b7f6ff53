"""The simulator's research reserve (`reserving`): empty hosts held back from small requests.

Two 8-GPU hosts. Two whole-host slices take both; a third is refused. The
first host's slice leaves; a 1-GPU slice arrives, then another 8-GPU one.
Without a reserve the small slice opens the empty host and the 8-GPU one is
refused; with one, the small slice is refused and the 8-GPU one gets the host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.placement import reserving, simulation, synthesis
from reconciler.placement.synthesis import H200_BAREMETAL, H200_SLICE, WorkloadRow


def _rows(whole_sku: str = H200_SLICE) -> list[WorkloadRow]:
    return [
        WorkloadRow(0.0, 3.0, whole_sku, 8),  # host 1, leaves at 3
        WorkloadRow(1.0, 100.0, whole_sku, 8),  # host 2
        WorkloadRow(2.0, 100.0, whole_sku, 8),  # no empty host: refused (the reserve's signal)
        WorkloadRow(4.0, 100.0, H200_SLICE, 1),  # would open host 1 again
        WorkloadRow(5.0, 100.0, whole_sku, 8),
    ]


def _run(policy: str, reserve: reserving.Reserve | None, rows: list[WorkloadRow] | None = None) -> simulation.Result:
    desired = synthesis.desired_state(synthesis.fleet_documents(2))
    return simulation.simulate(desired, rows or _rows(), policy=policy, reserve=reserve)


@pytest.mark.parametrize("whole_sku", [H200_SLICE, H200_BAREMETAL])
def test_a_small_request_may_not_open_the_host_refused_whole_host_demand_waits_for(whole_sku: str) -> None:
    plain = _run("default", None, _rows(whole_sku))
    held = _run("default", reserving.Reserve(3600, 2), _rows(whole_sku))
    assert (plain.accepted_gpus, plain.held_for_reserve) == (8 + 8 + 1, 0)
    assert (held.accepted_gpus, held.held_for_reserve) == (8 + 8 + 8, 1)
    [(no_host, refused)] = plain.rejections.items()
    assert refused == 2  # at 2 and at 5
    assert held.rejections == {no_host: 1, reserving.RESERVED: 1}
    assert held.as_dict()["reserve"] == "3600:2"


def test_refusals_older_than_the_window_reserve_nothing() -> None:
    assert _run("default", reserving.Reserve(1.5, 2)).accepted_gpus == 8 + 8 + 1  # refused at 2, asked at 4


def test_after_waits_for_that_many_refusals_in_the_window() -> None:
    assert _run("default", reserving.Reserve(3600, 2, after=2)).held_for_reserve == 0  # one refusal only
    gate = reserving.Gate(reserving.Reserve(3600, 2, after=2))
    for t in (10.0, 20.0, 30.0, 40.0):
        gate.whole_refused(t)
    assert gate.hold(40.0) == 2  # min(cap, 4 - 1)
    assert gate.hold(3625.0) == 1  # the refusal at 10 has left the window: 3 - 1
    assert gate.hold(10_000.0) == 0


def test_the_baselines_are_never_held_back() -> None:
    for policy in ("first-fit", "k8s-most-allocated", "seed-rank"):
        plain, gated = _run(policy, None), _run(policy, reserving.Reserve(3600, 2))
        assert (gated.accepted_gpus, gated.rejections, gated.held_for_reserve) == (
            plain.accepted_gpus,
            plain.rejections,
            0,
        )
        assert gated.reserve is None


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("3600:2", reserving.Reserve(3600, 2)), ("1800.5:1:3", reserving.Reserve(1800.5, 1, 3))],
)
def test_the_spec_parses(text: str, parsed: reserving.Reserve) -> None:
    assert reserving.Reserve.parse(text) == parsed
    assert reserving.Reserve.parse(str(parsed)) == parsed


@pytest.mark.parametrize("text", ["", "3600", "3600:2:1:1", "x:2", "3600:two", "0:2", "-5:2", "3600:0", "3600:2:0"])
def test_a_bad_spec_says_what_it_expects(text: str) -> None:
    with pytest.raises(ValueError, match="WINDOW_S"):
        reserving.Reserve.parse(text)


def test_simulate_one_workload_with_a_reserve_says_what_it_held_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, work = tmp_path / "fleet", tmp_path / "w.csv"
    assert cli.main(["fleet", "synth", "--nodes", "2", "--out", str(fleet)]) == 0
    work.write_text(
        "arrival_s,duration_s,sku,gpus\n" + "".join(f"{r.arrival_s},{r.duration_s},{r.sku},{r.gpus}\n" for r in _rows())
    )
    base = ["simulate", "--fleet", str(fleet), "--workload", str(work), "--quiet"]
    capsys.readouterr()
    assert cli.main([*base, "--json", "--reserve-whole-host", "3600:2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["accepted_gpus"], doc["reserve"], doc["held_for_reserve"]) == (24, "3600:2", 1)
    assert cli.main([*base, "--compare", "--reserve-whole-host", "3600:2"]) == 0
    out = capsys.readouterr().out
    assert "default held back 1 small request(s) for --reserve-whole-host 3600:2" in out
    assert "first-fit held back" not in out
    assert cli.main([*base, "--reserve-whole-host", "3600:-1"]) == 1
    assert "simulate.reserve" in capsys.readouterr().err
