"""`gpuaas fleet synth|workload`, `gpuaas simulate` and the simulator core, on small inputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from reconciler import cli, sources
from reconciler.placement import simulation, synthesis
from reconciler.placement.synthesis import WorkloadRow


def test_synth_fleet_validates_with_unique_macs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet"
    assert cli.main(["fleet", "synth", "--nodes", "12", "--out", str(out), "--amd-share", "0.25", "--seed", "3"]) == 0
    loaded = sources.load(out)
    assert loaded.errors == [] and loaded.warnings == []
    state = loaded.state
    assert len(state.nodes) == 12 and set(state.skus) == {
        synthesis.H200_SLICE,
        synthesis.H200_BAREMETAL,
        synthesis.AMD_SLICE,
    }
    macs = [s.mac_address for sm in state.slot_maps.values() for s in sm.slots]
    assert len(macs) == len(set(macs)) == 96
    assert sum(1 for n in state.nodes.values() if n.name.startswith("mi300x")) == 3
    for sub in ("skus", "images", "nodes", "slotmaps"):
        assert (out / sub).is_dir()
    # refuses to write over a fleet unless forced
    assert cli.main(["fleet", "synth", "--nodes", "2", "--out", str(out)]) == 1
    assert "not empty" in capsys.readouterr().err
    assert cli.main(["fleet", "synth", "--nodes", "2", "--out", str(out), "--force"]) == 0
    assert len(sources.load(out).state.nodes) == 2


def test_workload_and_simulate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
                "400",
                "--seed",
                "2",
            ]
        )
        == 0
    )
    with work.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["arrival_s", "duration_s", "sku", "gpus"] and len(rows) == 400
    assert {r["sku"] for r in rows} == {synthesis.H200_SLICE, synthesis.H200_BAREMETAL}
    capsys.readouterr()
    assert cli.main(["simulate", "--fleet", str(fleet), "--workload", str(work), "--json", "--quiet"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for key in (
        "policy",
        "offered_requests",
        "accepted_requests",
        "offered_gpus",
        "accepted_gpus",
        "acceptance_gpu",
        "fluid_bound_gpu",
        "rejected_with_capacity",
        "mean_empty_nodes",
        "placements_per_second",
    ):
        assert key in doc
    assert doc["policy"] == "default" and doc["offered_requests"] == 400
    assert doc["acceptance_gpu"] == pytest.approx(doc["accepted_gpus"] / doc["offered_gpus"], abs=1e-6)
    assert cli.main(["simulate", "--fleet", str(fleet), "--workload", str(work), "--compare"]) == 0
    captured = capsys.readouterr()
    for name in ("default", "first-fit", "k8s-least-allocated", "k8s-most-allocated", "seed-rank"):
        assert name in captured.out
    assert "400/400" in captured.err  # progress


def test_simulate_rejects_a_bad_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet, work = tmp_path / "fleet", tmp_path / "w.csv"
    cli.main(["fleet", "synth", "--nodes", "2", "--out", str(fleet)])
    work.write_text("arrival_s,duration_s,sku\n1,2,x\n")
    assert cli.main(["simulate", "--fleet", str(fleet), "--workload", str(work)]) == 1
    assert "simulate.workload.header" in capsys.readouterr().err
    work.write_text("arrival_s,duration_s,sku,gpus\n1,2,x,many\n")
    assert cli.main(["simulate", "--fleet", str(fleet), "--workload", str(work)]) == 1
    assert "line 2" in capsys.readouterr().err


def test_simulator_counts_against_a_hand_computed_run() -> None:
    """Two hosts. t=0: a baremetal lease takes one; t=1: 4 GPUs on the other; t=2: 8 GPUs refused
    (4 free: capacity, and the fluid bound refuses too); t=3: 2 GPUs; t=10: the lease ends;
    t=11: an 8-GPU slice takes the freed host."""
    desired = synthesis.desired_state(synthesis.fleet_documents(2))
    rows = [
        WorkloadRow(0.0, 10.0, synthesis.H200_BAREMETAL, 8),
        WorkloadRow(1.0, 100.0, synthesis.H200_SLICE, 4),
        WorkloadRow(2.0, 5.0, synthesis.H200_SLICE, 8),
        WorkloadRow(3.0, 5.0, synthesis.H200_SLICE, 2),
        WorkloadRow(11.0, 5.0, synthesis.H200_SLICE, 8),
    ]
    r = simulation.simulate(desired, rows, policy="default", clock=iter(range(1000)).__next__)
    assert (r.offered_requests, r.accepted_requests) == (5, 4)
    assert (r.offered_gpus, r.accepted_gpus) == (30, 22)
    assert r.fluid_bound_gpu == pytest.approx(22 / 30)
    assert r.rejected_with_capacity == 0
    assert r.rejections == {"plan.sku_unavailable.capacity": 1}
    # empty hosts: 1 during [0,1), 0 during [1,10), 0 after (the 8-GPU slice takes the freed host at 11)
    assert r.mean_empty_nodes == pytest.approx((1 * 1 + 0 * 9 + 1 * 1) / 11)


def test_fluid_bound_counts_capacity_lost_to_topology() -> None:
    """Two hosts, k8s-least-allocated spreads two 1-GPU slices over both: 14 GPUs free, no
    empty host for the 8-GPU request, which the fluid bound accepts."""
    desired = synthesis.desired_state(synthesis.fleet_documents(2))
    rows = [
        WorkloadRow(0.0, 50.0, synthesis.H200_SLICE, 1),
        WorkloadRow(1.0, 50.0, synthesis.H200_SLICE, 1),
        WorkloadRow(2.0, 50.0, synthesis.H200_SLICE, 8),
    ]
    spread = simulation.simulate(desired, rows, policy="k8s-least-allocated")
    assert (spread.accepted_gpus, spread.rejected_with_capacity) == (2, 1)
    assert spread.rejections == {"plan.sku_unavailable.topology": 1}
    assert spread.fluid_bound_gpu == 1.0
    packed = simulation.simulate(desired, rows, policy="default")
    assert (packed.accepted_gpus, packed.rejected_with_capacity) == (10, 0)


def test_workload_rows_hit_the_requested_load() -> None:
    offers = [synthesis.Offer(synthesis.H200_SLICE, 800, synthesis.DEFAULT_MIX)]
    rows = synthesis.workload_rows(offers, load=0.8, requests=20000, seed=1, baremetal=(synthesis.H200_BAREMETAL, 0.1))
    gpu_seconds = sum(r.gpus * r.duration_s for r in rows)
    assert gpu_seconds / (rows[-1].arrival_s * 800) == pytest.approx(0.8, rel=0.08)
    assert rows == synthesis.workload_rows(
        offers, load=0.8, requests=20000, seed=1, baremetal=(synthesis.H200_BAREMETAL, 0.1)
    )
