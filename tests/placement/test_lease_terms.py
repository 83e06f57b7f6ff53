"""Honest lease terms in the simulator (`lease_s`, `LeaseEnds`) and the repack bound."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from reconciler import cli
from reconciler.placement import simulation, synthesis
from reconciler.placement.simulation import LeaseEnds
from reconciler.placement.synthesis import WorkloadRow

SLICE, WHOLE = synthesis.H200_SLICE, synthesis.H200_BAREMETAL


def _records(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(text.splitlines()))


def test_lease_s_is_optional_per_file_and_per_row() -> None:
    rows = simulation.read_rows(
        _records("arrival_s,duration_s,sku,gpus,lease_s\n0,50,x,1,3600\n1,7200,x,2,3600\n2,10,x,1,\n")
    )
    assert [r.lease_s for r in rows] == [3600.0, 3600.0, None]
    # the allocation leaves when its use ends or when its term runs out, whichever comes first
    assert [r.departure_s for r in rows] == [50.0, 3601.0, 12.0]
    (plain,) = simulation.read_rows(_records("arrival_s,duration_s,sku,gpus\n5,10,x,4\n"))
    assert plain.lease_s is None and plain.departure_s == 15.0
    for bad in ("0", "-5", "soon", "inf"):
        with pytest.raises(ValueError, match="line 2"):
            simulation.read_rows(_records(f"arrival_s,duration_s,sku,gpus,lease_s\n0,5,x,1,{bad}\n"))


@pytest.mark.parametrize(
    ("lease_s", "mode", "told"),
    [
        (None, LeaseEnds.TERMS, None),  # no term: on demand
        (3600.0, LeaseEnds.TERMS, 100.0 + 3600.0),  # the term, not the use
        (3600.0, LeaseEnds.NONE, None),
        (None, LeaseEnds.EXACT, 100.0 + 50.0),  # the oracle: the real departure
        (20.0, LeaseEnds.EXACT, 100.0 + 20.0),  # cut at the end of the term
    ],
)
def test_what_the_planner_is_told(lease_s: float | None, mode: LeaseEnds, told: float | None) -> None:
    assert simulation.lease_end(WorkloadRow(100.0, 50.0, SLICE, 1, lease_s), mode) == told


@pytest.mark.parametrize(
    ("planned", "term"),
    [
        (1.0, 3600.0),
        (3600.0, 3600.0),
        (3601.0, 86400.0),
        (86400.0, 86400.0),
        (600000.0, 604800.0),
        (604801.0, 2 * 604800.0),
        (3 * 604800.0, 3 * 604800.0),
    ],
)
def test_terms_round_the_planned_use_up(planned: float, term: float) -> None:
    assert synthesis.term_for(planned, synthesis.DEFAULT_TERMS) == term


def test_lease_terms_keep_the_stream_and_cover_every_use() -> None:
    offers = [synthesis.Offer(SLICE, 80, synthesis.DEFAULT_MIX)]
    rows = synthesis.workload_rows(offers, load=0.9, requests=4000, seed=3, duration_sigma=1.5)
    exact = synthesis.lease_terms(rows, seed=3)
    early = synthesis.lease_terms(rows, early_release=0.5, seed=3)
    for terms in (exact, early):
        assert [(r.arrival_s, r.duration_s, r.sku, r.gpus) for r in terms] == [
            (r.arrival_s, r.duration_s, r.sku, r.gpus) for r in rows
        ]
        assert all(r.lease_s is not None and r.lease_s >= r.duration_s for r in terms)
        assert [r.departure_s for r in terms] == [r.arrival_s + r.duration_s for r in rows]
    # without early releases each term is the shortest that covers the use
    assert all(r.lease_s == synthesis.term_for(r.duration_s, synthesis.DEFAULT_TERMS) for r in exact)
    longer = sum(1 for a, b in zip(exact, early, strict=True) if b.lease_s != a.lease_s)
    assert 0 < longer < len(rows) // 2  # a share of the planners bought a longer term than they use
    assert synthesis.lease_terms(rows, early_release=0.5, seed=3) == early
    with pytest.raises(ValueError, match="increasing"):
        synthesis.lease_terms(rows, terms=(86400.0, 3600.0))
    with pytest.raises(ValueError, match="early_release"):
        synthesis.lease_terms(rows, early_release=1.5)


def test_exact_lease_ends_are_an_option_never_the_default() -> None:
    desired = synthesis.desired_state(synthesis.fleet_documents(6))
    offers = simulation.offers(desired, dict(synthesis.DEFAULT_MIX))
    rows = synthesis.workload_rows(offers, load=1.0, requests=3000, seed=2, baremetal=(WHOLE, 0.1), duration_sigma=1.5)
    plain = simulation.simulate(desired, rows, policy="default")
    blind = simulation.simulate(desired, rows, policy="default", lease_ends=LeaseEnds.NONE)
    oracle = simulation.simulate(desired, rows, policy="default", lease_ends=LeaseEnds.EXACT)
    # rows without lease_s are on demand: the default replay tells the planner nothing
    assert (plain.accepted_gpus, plain.rejections) == (blind.accepted_gpus, blind.rejections)
    assert plain.as_dict()["lease_ends"] is False and plain.as_dict()["lease_mode"] == "terms"
    assert oracle.as_dict()["lease_ends"] is True and oracle.accepted_gpus != plain.accepted_gpus
    termed = synthesis.lease_terms(rows, seed=2)
    told = simulation.simulate(desired, termed, policy="default")
    assert told.as_dict()["lease_ends"] is True
    assert told.fluid_bound_gpu == plain.fluid_bound_gpu  # the same departures, whatever is told


def test_repack_bound_moves_what_a_policy_cannot() -> None:
    """Two hosts; k8s-least-allocated spreads two 1-GPU slices, so the 8-GPU request finds no
    empty host. With every allocation free to move both slices share a host and it fits;
    the third 8-GPU request does not fit even then (6 GPUs free)."""
    desired = synthesis.desired_state(synthesis.fleet_documents(2))
    rows = [
        WorkloadRow(0.0, 50.0, SLICE, 1),
        WorkloadRow(1.0, 50.0, SLICE, 1),
        WorkloadRow(2.0, 50.0, SLICE, 8),
        WorkloadRow(3.0, 50.0, WHOLE, 8),
        WorkloadRow(60.0, 50.0, WHOLE, 8),
    ]
    spread = simulation.simulate(desired, rows, policy="k8s-least-allocated")
    assert spread.accepted_gpus == 2 + 8  # the 8-GPU slice refused, the lease at 60 s accepted
    assert simulation.repack_bound(desired, rows) == pytest.approx((2 + 8 + 8) / 26)


def test_repack_bound_meets_the_fluid_bound_on_power_of_two_hosts() -> None:
    """Sizes 1, 2, 4, 8 on hosts of two NUMA groups of two pairs nest like a buddy allocator:
    first-fit decreasing packs any set whose GPUs fit in aggregate, so the two bounds agree,
    and no policy beats them."""
    desired = synthesis.desired_state(synthesis.fleet_documents(8))
    offers = simulation.offers(desired, dict(synthesis.DEFAULT_MIX))
    rows = synthesis.workload_rows(offers, load=1.0, requests=3000, seed=5, baremetal=(WHOLE, 0.1), duration_sigma=1.5)
    bound = simulation.repack_bound(desired, rows)
    runs = [simulation.simulate(desired, rows, policy=p) for p in ("default", "first-fit")]
    assert bound == pytest.approx(runs[0].fluid_bound_gpu)
    assert all(r.acceptance_gpu < bound for r in runs)


def test_workload_lease_terms_and_simulate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet, work = tmp_path / "fleet", tmp_path / "w.csv"
    assert cli.main(["fleet", "synth", "--nodes", "6", "--out", str(fleet)]) == 0
    assert (
        cli.main(
            [
                "fleet",
                "workload",
                "--fleet",
                str(fleet),
                "--out",
                str(work),
                "--load",
                "0.9",
                "--requests",
                "300",
                "--seed",
                "2",
                "--lease-terms",
                "--early-release",
                "0.3",
            ]
        )
        == 0
    )
    with work.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["arrival_s", "duration_s", "sku", "gpus", "lease_s"] and len(rows) == 300
    assert {float(r["lease_s"]) for r in rows} <= {3600.0, 86400.0, 604800.0}
    capsys.readouterr()
    assert (
        cli.main(["simulate", "--fleet", str(fleet), "--workload", str(work), "--json", "--quiet", "--repack-bound"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["lease_mode"] == "terms" and doc["lease_ends"] is True
    assert doc["repack_bound_gpu"] is not None
    assert (
        cli.main(
            [
                "simulate",
                "--fleet",
                str(fleet),
                "--workload",
                str(work),
                "--compare",
                "--quiet",
                "--lease-ends",
                "exact",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "exact departures (oracle)" in out and "repack_bound" in out
    assert (
        cli.main(
            [
                "fleet",
                "workload",
                "--fleet",
                str(fleet),
                "--out",
                str(work),
                "--load",
                "0.9",
                "--lease-terms",
                "1h,2h,1h",
            ]
        )
        == 1
    )
    assert "increasing" in capsys.readouterr().err
