"""The workload suite: deterministic generators, a tiny `gpuaas simulate --suite`, default vs first-fit."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from reconciler import cli
from reconciler.placement import reserving, simulation, suite, synthesis

BARE = synthesis.H200_BAREMETAL


def _offers() -> list[synthesis.Offer]:
    return simulation.offers(suite.fleet(4), dict(suite.SYNTH_MIX))


@pytest.mark.parametrize("fam", suite.FAMILIES, ids=lambda f: f.name)
def test_every_family_is_a_pure_function_of_its_seed(fam: suite.Family) -> None:
    offers = _offers()
    one = suite.family_rows(fam, offers, load=0.9, requests=300, seed=4, baremetal_sku=BARE)
    assert one == suite.family_rows(fam, offers, load=0.9, requests=300, seed=4, baremetal_sku=BARE)
    assert one != suite.family_rows(fam, offers, load=0.9, requests=300, seed=5, baremetal_sku=BARE)
    assert len(one) == 300
    assert [r.arrival_s for r in one] == sorted(r.arrival_s for r in one)
    assert {r.gpus for r in one if r.sku == synthesis.H200_SLICE} <= set(fam.mix)
    assert all((r.lease_s is not None) == fam.terms for r in one)
    assert any(r.sku == BARE for r in one) == (fam.baremetal > 0)


def test_bursty_arrivals_keep_the_stream_and_clump_it() -> None:
    fam = suite.family("synth-bursty")
    calm = suite.Family("calm", fam.mix, fam.baremetal, fam.sigma)
    offers = _offers()
    poisson = suite.family_rows(calm, offers, load=0.9, requests=4000, seed=2, baremetal_sku=BARE)
    bursty = suite.family_rows(fam, offers, load=0.9, requests=4000, seed=2, baremetal_sku=BARE)
    # same requests, same durations: only the arrival clock changes
    assert [(r.sku, r.gpus, r.duration_s) for r in poisson] == [(r.sku, r.gpus, r.duration_s) for r in bursty]
    # the mean rate is kept (within the noise of a few dozen calm/burst periods)
    assert bursty[-1].arrival_s == pytest.approx(poisson[-1].arrival_s, rel=0.35)

    def dispersion(rows: list[synthesis.WorkloadRow]) -> float:
        counts = Counter(int(r.arrival_s // 1800) for r in rows)
        values = [counts.get(i, 0) for i in range(int(rows[-1].arrival_s // 1800))]
        mean = sum(values) / len(values)
        return sum((v - mean) ** 2 for v in values) / len(values) / mean

    assert dispersion(poisson) < 2.0 < dispersion(bursty)  # Poisson: ~1; the MMPP clumps arrivals


def test_suite_runs_a_tiny_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        [
            "simulate",
            "--suite",
            "--json",
            "--seeds",
            "1",
            "--requests",
            "200",
            "--loads",
            "0.9",
            "--nodes",
            "4",
            "--families",
            "synth,eight-gpu",
            "--first-seed",
            "7",
        ]
    )
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["first_seed"] == 7 and doc["seeds"] == 1
    assert [c["family"] for c in doc["cells"]] == ["synth", "eight-gpu"]
    for cell in doc["cells"]:
        assert set(cell["acceptance_gpu"]) == {
            "default",
            "first-fit",
            "k8s-least-allocated",
            "k8s-most-allocated",
            "seed-rank",
        }
        assert 0 < cell["fluid_bound_gpu"] <= 1
    assert code == (1 if doc["default_below_a_baseline"] else 0)
    assert "10/10 runs" in captured.err  # progress
    assert cli.main(
        [
            "simulate",
            "--suite",
            "--quiet",
            "--seeds",
            "1",
            "--requests",
            "100",
            "--loads",
            "0.9",
            "--nodes",
            "2",
            "--families",
            "one-gpu",
        ]
    ) in (0, 1)
    table = capsys.readouterr().out
    assert "one-gpu" in table and "fluid" in table and "goal" in table


def test_suite_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--suite", "--families", "nope"]) == 1
    assert "simulate.suite.family" in capsys.readouterr().err
    assert cli.main(["simulate", "--suite", "--loads", "x"]) == 1
    assert "simulate.suite.loads" in capsys.readouterr().err
    assert cli.main(["simulate", "--suite", "--first-seed", "0"]) == 1
    assert "simulate.suite.size" in capsys.readouterr().err
    assert cli.main(["simulate"]) == 1  # neither --suite nor --fleet/--workload
    assert "simulate.args.missing" in capsys.readouterr().err


def test_cells_judge_default_against_every_baseline() -> None:
    cell = suite.Cell(
        "f",
        0.9,
        False,
        offered=1000,
        fluid=1000,
        accepted={
            "default": 960,
            "first-fit": 950,
            "k8s-least-allocated": 700,
            "k8s-most-allocated": 970,
            "seed-rank": 940,
        },
    )
    assert cell.best_baseline == "k8s-most-allocated" and cell.below == ["k8s-most-allocated"]
    assert cell.closed == pytest.approx(-1 / 3)
    misses = suite.goal_misses([cell])
    assert any("below k8s-most-allocated" in m for m in misses) and any("< 25%" in m for m in misses)
    cell.accepted["default"] = 980
    assert cell.below == [] and cell.closed == pytest.approx(1 / 3) and suite.goal_misses([cell]) == []


def test_default_never_below_first_fit_on_a_small_fixed_case() -> None:
    cells = suite.run([suite.family("eight-gpu")], [0.9], seeds=1, requests=2000, nodes=8)
    cell = cells[0]
    assert cell.accepted["default"] >= cell.accepted["first-fit"]
    assert cell.accepted["default"] > cell.accepted["k8s-least-allocated"]


def test_default_is_not_below_any_baseline_on_any_family_at_a_small_scale() -> None:
    """Every family of the suite, one stream each: `default` accepts at least as many GPUs as every baseline.

    The suite's goal at a scale CI affords (64 hosts, 5,000 requests, load 0.8: seconds). Streams this
    short are noisy at load 0.9 (one decision moves a whole trajectory), so this is a regression check on
    fixed streams, not the measurement (docs/placement.md, "Workload suite"). It fails when the ranking
    degrades: ranking the node with the fewest allocations first puts `default` below three baselines on
    five families.
    """
    cells = suite.run(suite.FAMILIES, [0.8], seeds=1, requests=5000, nodes=64)
    assert len(cells) == len(suite.FAMILIES)
    assert {c.family: c.below for c in cells if c.below} == {}


def test_cells_say_how_far_the_gap_closed_moves_between_streams() -> None:
    """The per-seed gap closed and its standard error: a 3-seed cell swings by tenths at 64 hosts."""
    base = {"first-fit": 900, "k8s-least-allocated": 500, "k8s-most-allocated": 880, "seed-rank": 890}
    cell = suite.Cell("f", 0.9, False)
    for offered, fluid, mine, ff in ((1000, 1000, 950, 900), (1000, 1000, 910, 900), (1000, 900, 900, 900)):
        accepted = {**base, "default": mine, "first-fit": ff}
        cell.seeds.append((offered, fluid, accepted))
        cell.offered += offered
        cell.fluid += fluid
        for p, v in accepted.items():
            cell.accepted[p] = cell.accepted.get(p, 0) + v
    # the third stream has no gap to the fluid bound: no ratio of its own, and it weighs nothing in the spread
    assert cell.closed == pytest.approx(60 / 200)
    assert cell.closed_by_seed == pytest.approx([0.5, 0.1])
    # ratio estimator: residuals 50 - 0.3 x 100, 10 - 0.3 x 100, 0; mean gap 200 / 3
    assert cell.closed_se == pytest.approx(math.sqrt((20**2 + 20**2) / (3 * 2)) / (200 / 3))
    doc = cell.as_dict()
    assert doc["gap_closed_by_seed"] == [0.5, 0.1] and doc["gap_closed_se"] == pytest.approx(0.1732, abs=1e-4)
    one = suite.Cell("g", 0.9, False, offered=1000, fluid=1000, accepted={**base, "default": 950})
    assert one.closed_se is None and one.as_dict()["gap_closed_se"] is None  # no seeds recorded: no spread


def test_a_suite_run_records_every_seed(capsys: pytest.CaptureFixture[str]) -> None:
    cells = suite.run([suite.family("synth")], [0.9], seeds=2, requests=150, nodes=2)
    (cell,) = cells
    assert len(cell.seeds) == 2
    assert sum(o for o, _, _ in cell.seeds) == cell.offered and sum(f for _, f, _ in cell.seeds) == cell.fluid
    assert {p: sum(a[p] for _, _, a in cell.seeds) for p in cell.accepted} == cell.accepted
    assert cli.main(
        [
            "simulate",
            "--suite",
            "--quiet",
            "--seeds",
            "2",
            "--requests",
            "150",
            "--loads",
            "0.9",
            "--nodes",
            "2",
            "--families",
            "synth",
        ]
    ) in (0, 1)
    assert "± se" in capsys.readouterr().out


def test_the_suite_tells_default_what_lease_ends_says(capsys: pytest.CaptureFixture[str]) -> None:
    """`--lease-ends` reaches the suite's runs (it was ignored there): only `default` reads it."""
    fam = [suite.family("philly-terms")]
    by_mode = {
        mode: suite.run(fam, [1.0], seeds=1, requests=600, nodes=8, lease_ends=mode)[0].accepted
        for mode in simulation.LeaseEnds
    }
    baselines = [{p: a for p, a in acc.items() if p != "default"} for acc in by_mode.values()]
    assert all(b == baselines[0] for b in baselines)
    # on this stream terms, the exact departures and no ends at all each place differently
    assert len({acc["default"] for acc in by_mode.values()}) == 3
    args = ["simulate", "--suite", "--seeds", "1", "--requests", "600", "--loads", "1.0", "--nodes", "8"]
    assert cli.main([*args, "--json", "--families", "philly-terms", "--lease-ends", "exact"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    assert doc["lease_ends"] == "exact"
    (cell,) = doc["cells"]
    exact = by_mode[simulation.LeaseEnds.EXACT]
    assert cell["acceptance_gpu"]["default"] == round(exact["default"] / cell["offered_gpus"], 6)
    assert cli.main([*args, "--families", "philly-terms", "--quiet", "--no-lease-ends"]) in (0, 1)
    assert "default told lease ends: none" in capsys.readouterr().out


def test_the_suite_runs_default_with_a_reserve_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`--reserve-whole-host` reaches `default`'s runs only; a bad spec is a usage error with its code."""
    fam = [suite.family("synth-bursty")]
    plain, held = (
        suite.run(fam, [1.0], seeds=1, requests=1500, nodes=8, reserve=r)[0].accepted
        for r in (None, reserving.Reserve(3600, 2))
    )
    assert {p: a for p, a in plain.items() if p != "default"} == {p: a for p, a in held.items() if p != "default"}
    assert plain["default"] != held["default"]  # this bursty stream refuses whole hosts, so the reserve acts
    args = ["simulate", "--suite", "--seeds", "1", "--requests", "1500", "--loads", "1.0", "--nodes", "8"]
    assert cli.main([*args, "--json", "--quiet", "--families", "synth-bursty", "--reserve-whole-host", "3600:2"]) in (
        0,
        1,
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["reserve_whole_host"] == "3600:2"
    assert doc["cells"][0]["acceptance_gpu"]["default"] == round(held["default"] / doc["cells"][0]["offered_gpus"], 6)
    assert cli.main([*args, "--reserve-whole-host", "3600"]) == 1
    err = capsys.readouterr().err
    assert "simulate.reserve" in err and "WINDOW_S:CAP" in err and "Traceback" not in err
