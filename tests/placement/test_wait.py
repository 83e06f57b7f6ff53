"""The simulator's wait-and-retry mode (`simulation.simulate(wait_s=...)`): refused requests wait, oldest first.

Two 8-GPU hosts. r0 holds host 1 until 10, r1 holds host 2 until 101; r2,
an 8-GPU slice at 2, finds no host. The loss model drops it; with a wait it
stays pending and gets host 1 when r0 leaves at 10, then holds it for its own
duration from then.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from desired import models as m
from desired.state import DesiredState
from reconciler import cli
from reconciler.placement import placing, reserving, simulation, suite, synthesis, waiting
from reconciler.placement.synthesis import H200_SLICE, WorkloadRow

R0 = WorkloadRow(0.0, 10.0, H200_SLICE, 8)  # host 1 until 10
R1 = WorkloadRow(1.0, 100.0, H200_SLICE, 8)  # host 2 until 101
R2 = WorkloadRow(2.0, 50.0, H200_SLICE, 8)  # no host at 2


def _run(
    rows: list[WorkloadRow],
    wait_s: float | None,
    reserve: reserving.Reserve | None = None,
    policy: str = "default",
) -> simulation.Result:
    desired = synthesis.desired_state(synthesis.fleet_documents(2))
    return simulation.simulate(desired, rows, policy=policy, wait_s=wait_s, reserve=reserve)


def _bursty(*, seed: int) -> tuple[DesiredState, list[WorkloadRow]]:
    """An 8-host synthetic fleet and 1,500 `synth-bursty` requests at load 1.0: enough for the queue to work."""
    desired = suite.fleet(8)
    rows = suite.family_rows(
        suite.family("synth-bursty"),
        simulation.offers(desired, dict(suite.SYNTH_MIX)),
        load=1.0,
        requests=1500,
        seed=seed,
        baremetal_sku=synthesis.H200_BAREMETAL,
    )
    return desired, rows


def test_a_refused_request_is_placed_when_a_host_frees_and_holds_it_from_then() -> None:
    late = WorkloadRow(55.0, 5.0, H200_SLICE, 8)  # r2 holds host 1 until 10 + 50 = 60, not 2 + 50
    rows = [R0, R1, R2, late]
    lost = _run(rows, None)
    assert (lost.accepted_gpus, lost.accepted_requests) == (24, 3)  # r2 dropped; `late` finds host 1 free
    waited = _run(rows, 3600)
    assert (waited.accepted_gpus, waited.accepted_requests, waited.expired_requests) == (32, 4, 0)
    assert waited.waited_requests == 2  # r2 from 2 to 10, `late` from 55 to 60
    assert waited.mean_wait_s == pytest.approx((8 + 5) / 4)
    assert waited.p95_wait_s == 8
    assert waited.gpu_seconds == pytest.approx(8 * (10 + 100 + 50 + 5))
    assert waited.rejections == lost.rejections | {next(iter(lost.rejections)): 2}  # first refusals, at arrival
    doc = waited.as_dict()
    assert (doc["wait_s"], doc["expired_requests"], doc["p95_wait_s"]) == (3600, 0, 8)


@pytest.mark.parametrize(
    ("lease_ends", "ends_at"),
    [
        (simulation.LeaseEnds.TERMS, 2.0 + 70.0),
        (simulation.LeaseEnds.EXACT, 10.0 + 50.0),
        (simulation.LeaseEnds.NONE, None),
    ],
)
def test_a_request_placed_late_keeps_its_requested_at_and_its_term(
    monkeypatch: pytest.MonkeyPatch, lease_ends: simulation.LeaseEnds, ends_at: float | None
) -> None:
    """As the product's allocation does: `default` ranks a host by its oldest request (`packing.node_key`) and
    a term is counted from the request (`requests.lease_end`); only the true departure moves with the placement."""
    asked: dict[str, placing.Request] = {}
    place = placing.Engine.place

    def spy(engine: placing.Engine, req: placing.Request, **kw: object) -> placing.Placed | placing.Refused:
        asked[req.allocation_id] = req
        return place(engine, req, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(placing.Engine, "place", spy)
    late = replace(R2, lease_s=70.0)  # r2 arrives at 2, is placed at 10 (host 1 frees), holds it 50 s
    res = simulation.simulate(
        synthesis.desired_state(synthesis.fleet_documents(2)), [R0, R1, late], wait_s=3600, lease_ends=lease_ends
    )
    assert res.waited_requests == 1
    (r2,) = [req for aid, req in asked.items() if aid.endswith("2")]
    assert (r2.requested_at, r2.ends_at) == (2.0, ends_at)


@pytest.mark.parametrize(("wait_s", "placed"), [(5, False), (8, False), (8.5, True)])
def test_a_request_pending_for_wait_s_or_longer_expires(wait_s: float, placed: bool) -> None:
    """Like the pending deadline (`policies.deadlines.overdue`: pending >= the deadline fails it)."""
    res = _run([R0, R1, R2], wait_s)  # r2 could be placed at 10, after waiting 8
    assert (res.accepted_gpus, res.expired_requests) == ((24, 0) if placed else (16, 1))


def test_the_queue_is_retried_oldest_first() -> None:
    """r2 (long) and r3 (short) wait; host 1 frees at 10 and goes to r2, the older; r3 expires at 52."""
    long, short = WorkloadRow(2.0, 1000.0, H200_SLICE, 8), WorkloadRow(3.0, 1.0, H200_SLICE, 8)
    res = _run([R0, R1, long, short], 50)
    assert (res.accepted_requests, res.expired_requests) == (3, 1)
    assert res.gpu_seconds == pytest.approx(8 * (10 + 100 + 1000))  # youngest first would have served `short`


def test_a_younger_request_that_fits_is_not_blocked_by_an_older_one() -> None:
    """The planner retries every pending request: one that fits is placed even when an older one cannot be."""
    half = WorkloadRow(0.0, 10.0, H200_SLICE, 4)  # host 1 half until 10
    rest = WorkloadRow(0.5, 1000.0, H200_SLICE, 4)  # host 1's other half
    big, small = WorkloadRow(2.0, 5.0, H200_SLICE, 8), WorkloadRow(3.0, 5.0, H200_SLICE, 4)
    res = _run([half, rest, R1, big, small], 50)
    assert (res.accepted_requests, res.expired_requests) == (4, 1)  # at 10 `small` gets the 4 GPUs, `big` cannot
    assert res.mean_wait_s == pytest.approx(7 / 4)


def test_off_the_loss_model_is_unchanged_and_a_zero_wait_is_the_loss_model() -> None:
    desired, rows = _bursty(seed=1)
    for policy in ("default", "first-fit"):
        plain = simulation.simulate(desired, rows, policy=policy)
        off = simulation.simulate(desired, rows, policy=policy, wait_s=None)
        zero = simulation.simulate(desired, rows, policy=policy, wait_s=0)
        assert "wait_s" not in off.as_dict() and off.wait_s is None and off.expired_requests == 0
        for key in ("accepted_gpus", "accepted_requests", "fluid_bound_gpu", "rejections", "rejected_with_capacity"):
            assert getattr(off, key) == getattr(plain, key) == getattr(zero, key), key
        assert zero.expired_requests == plain.offered_requests - plain.accepted_requests > 0
        assert zero.waited_requests == 0


def test_the_fluid_bound_becomes_a_fluid_queue_with_the_same_deadline() -> None:
    late = WorkloadRow(55.0, 5.0, H200_SLICE, 8)
    assert _run([R0, R1, R2, late], None).fluid_bound_gpu == pytest.approx(24 / 32)  # r2 dropped
    assert _run([R0, R1, R2, late], 3600).fluid_bound_gpu == 1.0  # r2 waits, then `late` waits for it
    # r2 holds its 8 fluid GPUs from 10 to 60, so `late` must wait 5 s: a 4 s wait drops it
    assert _run([R0, R1, R2, late], 4).fluid_bound_gpu == pytest.approx(24 / 32)
    assert _run([R0, R1, R2], 5).fluid_bound_gpu == pytest.approx(16 / 24)  # r2 would wait 8


def test_a_pending_reserve_keeps_a_freed_host_for_a_pending_whole_host_request() -> None:
    """r2 (1 GPU) and r3 (8 GPUs) wait; host 1 frees at 10. Oldest first, r2 would open it and r3 expire;
    `pending:1` (one whole-host request pending) refuses r2 that host, so r3 gets it and r2 expires."""
    small, whole = WorkloadRow(2.0, 100.0, H200_SLICE, 1), WorkloadRow(3.0, 100.0, H200_SLICE, 8)
    rows = [R0, R1, small, whole]
    plain = _run(rows, 50)
    held = _run(rows, 50, reserving.Reserve.parse("pending:1"))
    assert (plain.accepted_gpus, plain.expired_requests, plain.held_for_reserve) == (17, 1, 0)
    assert (held.accepted_gpus, held.expired_requests, held.held_for_reserve) == (24, 1, 1)
    assert held.reserve == "pending:1"
    assert _run(rows, 50, reserving.Reserve.parse("pending:1"), policy="first-fit").accepted_gpus == 17
    with pytest.raises(ValueError, match="needs wait_s"):
        _run(rows, None, reserving.Reserve.parse("pending:1"))


def test_the_pending_reserve_spec() -> None:
    assert reserving.Reserve.parse("pending:2") == reserving.Reserve(0.0, 2, 1, pending=True)
    assert str(reserving.Reserve.parse("pending:2:3")) == "pending:2:3"
    gate = reserving.Gate(reserving.Reserve.parse("pending:2:2"))
    assert [gate.hold(0.0, n) for n in (0, 1, 2, 3, 5)] == [0, 0, 1, 2, 2]
    for bad in ("pending", "pending:0", "pending:x", "pending:1:0"):
        with pytest.raises(ValueError, match="CAP"):
            reserving.Reserve.parse(bad)


@pytest.mark.parametrize("reserve", [None, "pending:2", "3600:2", "fleet:2", "fleet:3:2"])
def test_the_retry_shortcuts_give_the_naive_retrys_figures(
    monkeypatch: pytest.MonkeyPatch, reserve: str | None
) -> None:
    """Retrying only after a release (or a fall in R), and skipping what cannot fit, changes no figure."""
    desired, rows = _bursty(seed=1)
    res = None if reserve is None or reserve.startswith("fleet:") else reserving.Reserve.parse(reserve)
    if reserve is not None and reserve.startswith("fleet:"):  # the planner's rule: fleet.placement.whole_host_reserve
        _, cap, after = (reserve + ":1").split(":")[:3]
        reserving.set_on_fleet(desired, m.WholeHostReserve(max_hosts=int(cap), after_pending=int(after)))

    def figures() -> dict[str, object]:
        doc = simulation.simulate(desired, rows, wait_s=3600, reserve=res).as_dict()
        doc.pop("engine_seconds")
        doc.pop("placements_per_second")
        return doc

    fast = figures()
    monkeypatch.setattr(waiting, "RETRY_SHORTCUTS", False)
    naive = figures()
    assert fast == naive
    assert fast["expired_requests"] and fast["waited_requests"]  # the queue was at work
    assert fast["held_for_reserve"] or reserve is None  # and the reserve


@pytest.mark.parametrize(("cap", "after"), [(1, 1), (2, 1), (2, 2)])
def test_the_planners_reserve_gives_the_pending_reserves_figures_on_one_pool(cap: int, after: int) -> None:
    """`fleet.placement.whole_host_reserve` runs the planner's rule (`reserving.Holding`); on the synthetic
    fleet (one pool) its W is the research `pending:CAP:AFTER`'s, so every figure is the same."""
    desired, rows = _bursty(seed=2)
    research = simulation.simulate(desired, rows, wait_s=3600, reserve=reserving.Reserve(0.0, cap, after, pending=True))
    reserving.set_on_fleet(desired, m.WholeHostReserve(max_hosts=cap, after_pending=after))
    planner = simulation.simulate(desired, rows, wait_s=3600)
    assert planner.held_for_reserve > 0 and planner.whole_host_reserve == (f"{cap}" if after == 1 else f"{cap}:{after}")
    mine, theirs = planner.as_dict(), research.as_dict()
    for doc in (mine, theirs):
        for key in ("engine_seconds", "placements_per_second", "reserve", "whole_host_reserve"):
            doc.pop(key, None)
    assert mine == theirs
    plain = simulation.simulate(suite.fleet(8), rows, wait_s=3600)
    assert plain.accepted_gpus != planner.accepted_gpus  # the reserve changed something


def test_simulate_wait_s_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet, work = tmp_path / "fleet", tmp_path / "w.csv"
    assert cli.main(["fleet", "synth", "--nodes", "2", "--out", str(fleet)]) == 0
    work.write_text(
        "arrival_s,duration_s,sku,gpus\n" + "".join(f"{r.arrival_s},{r.duration_s},{r.sku},8\n" for r in (R0, R1, R2))
    )
    capsys.readouterr()
    one = ["simulate", "--fleet", str(fleet), "--workload", str(work), "--quiet"]
    assert cli.main([*one, "--json", "--wait-s", "3600"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["wait_s"], doc["accepted_gpus"], doc["expired_requests"], doc["mean_wait_s"]) == (3600, 24, 0, 2.667)
    assert cli.main([*one, "--wait-s", "3600"]) == 0
    assert "wait" in capsys.readouterr().out
    # the repack bound is the loss model's: it is not put beside a wait-and-retry replay
    assert cli.main([*one, "--json", "--compare", "--wait-s", "3600"]) == 0
    assert {r["repack_bound_gpu"] for r in json.loads(capsys.readouterr().out)["results"]} == {None}
    assert cli.main([*one, "--json", "--compare"]) == 0
    assert None not in {r["repack_bound_gpu"] for r in json.loads(capsys.readouterr().out)["results"]}
    args = ["simulate", "--suite", "--seeds", "1", "--requests", "300", "--loads", "1.0", "--nodes", "8", "--quiet"]
    assert cli.main([*args, "--json", "--families", "synth-bursty", "--wait-s", "3600"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["wait_s"] == 3600
    assert set(doc["cells"][0]["waits"]["default"]) == {"expired_requests", "mean_wait_s", "p95_wait_s"}
    for bad in ("-1", "soon", "inf", "nan"):
        assert cli.main([*args, "--wait-s", bad]) == 1
        err = capsys.readouterr().err
        assert "simulate.wait" in err and "--wait-s" in err and "Traceback" not in err
    assert cli.main([*args, "--reserve-whole-host", "pending:2"]) == 1
    err = capsys.readouterr().err
    assert "simulate.reserve" in err and "--wait-s" in err


@pytest.mark.parametrize("shortcuts", [True, False])
def test_a_request_the_reserve_refused_is_retried_when_the_reserve_falls(
    monkeypatch: pytest.MonkeyPatch, shortcuts: bool
) -> None:
    """With no release in between, the queue is still retried at an arrival once R has fallen.

    A whole-host request refused at 2 (`3600:2` counts it until 3602) waits, gets host 1 at 10 and leaves at 25.
    A 1-GPU request at 30 may not open host 1 (R = 1) and waits; at the arrival at 4000 R is 0 and it is
    placed, before the newcomer (not when the newcomer leaves at 4001).
    """
    monkeypatch.setattr(waiting, "RETRY_SHORTCUTS", shortcuts)
    whole = WorkloadRow(2.0, 15.0, H200_SLICE, 8)
    small, newcomer = WorkloadRow(30.0, 100.0, H200_SLICE, 1), WorkloadRow(4000.0, 1.0, H200_SLICE, 1)
    res = _run(
        [R0, WorkloadRow(1.0, 10_000.0, H200_SLICE, 8), whole, small, newcomer], 5000, reserving.Reserve(3600, 2)
    )
    assert (res.accepted_requests, res.held_for_reserve) == (5, 1)
    assert res.mean_wait_s == pytest.approx((8 + 3970) / 5)


def test_simulate_whole_host_reserve_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--whole-host-reserve MAX_HOSTS[:AFTER_PENDING]` sets the fleet's setting: the 1-GPU request may not
    open the host the waiting 8-GPU one needs (as `pending:1` in the test above)."""
    fleet, work = tmp_path / "fleet", tmp_path / "w.csv"
    assert cli.main(["fleet", "synth", "--nodes", "2", "--out", str(fleet)]) == 0
    rows = [R0, R1, WorkloadRow(2.0, 100.0, H200_SLICE, 1), WorkloadRow(3.0, 100.0, H200_SLICE, 8)]
    work.write_text(
        "arrival_s,duration_s,sku,gpus\n" + "".join(f"{r.arrival_s},{r.duration_s},{r.sku},{r.gpus}\n" for r in rows)
    )
    capsys.readouterr()
    one = ["simulate", "--fleet", str(fleet), "--workload", str(work), "--quiet", "--wait-s", "50"]
    assert cli.main([*one, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["accepted_gpus"], doc["held_for_reserve"], "whole_host_reserve" in doc) == (17, 0, False)
    assert cli.main([*one, "--json", "--whole-host-reserve", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["accepted_gpus"], doc["held_for_reserve"], doc["whole_host_reserve"]) == (24, 1, "1")
    assert cli.main([*one, "--compare", "--whole-host-reserve", "1"]) == 0
    out = capsys.readouterr().out
    assert "default held back 1 small request(s) for placement.whole_host_reserve 1 (the planner's rule)" in out
    assert "first-fit held back" not in out
    for bad in (["--whole-host-reserve", "2:0"], ["--whole-host-reserve", "x"], ["--whole-host-reserve", "1:2:3"]):
        assert cli.main([*one, *bad]) == 1
        assert "simulate.reserve" in capsys.readouterr().err
    assert cli.main([*one, "--whole-host-reserve", "1", "--reserve-whole-host", "pending:1"]) == 1
    assert "one reserve at a time" in capsys.readouterr().err
    assert cli.main([*one[:-2], "--whole-host-reserve", "1"]) == 1  # no --wait-s
    assert "needs --wait-s" in capsys.readouterr().err
