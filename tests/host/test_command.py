"""`gpuaas host converge|run`, the host demo and the host bench, as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuaas_tools.demo import hosts as demo
from gpuaas_tools.lab import host as lab
from reconciler import cli
from reconciler.store import hostplans as central_plans
from schemas import hostplans
from schemas.errors import GpuaasError
from tests.host.conftest import Lab


def test_converge_dry_run_prints_actions_and_changes_nothing(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = lab.root / "plan.json"
    plan_file.write_text(json.dumps(hostplans.to_json(lab.plan(1, vms=(lab.vm("alloc-1", (0,)),)))))
    config = lab.write_config()
    argv = ["host", "converge", "--node", lab.node, "--config", str(config), "--plan-file", str(plan_file)]
    assert cli.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: would run 10 action(s)" in out and "provision:disk_write alloc-1" in out
    assert "provision:image_fetch alloc-1" in out
    assert not (Path(lab.settings_doc["state_dir"]) / "leases" / "slot-0.json").exists()

    status = lab.root / "status.json"
    assert cli.main([*argv, "--status-file", str(status), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["converged"] and [s["state"] for s in doc["slots"]] == ["active", "available", "available", "available"]
    assert json.loads(status.read_text())["observed_generation"] == 1
    assert (
        cli.main(
            [
                "host",
                "run",
                "--node",
                lab.node,
                "--config",
                str(config),
                "--plan-file",
                str(plan_file),
                "--passes",
                "2",
                "--interval",
                "0.1",
            ]
        )
        == 0
    )


def test_a_plan_for_another_node_is_refused(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = lab.root / "plan.json"
    plan_file.write_text(json.dumps(hostplans.to_json(lab.plan(1, node="node-b"))))
    assert (
        cli.main(
            ["host", "converge", "--node", lab.node, "--config", str(lab.write_config()), "--plan-file", str(plan_file)]
        )
        == 1
    )
    assert "host.plan.wrong_node" in capsys.readouterr().err


def test_host_agent_without_a_database_url_says_so_and_starts_no_database(
    lab: Lab, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPUAAS_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUAAS_STATE_DIR", str(tmp_path / "state"))
    assert cli.main(["host", "converge", "--node", lab.node, "--config", str(lab.write_config())]) == 1
    assert "host.service.url_missing" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # no embedded server was set up for the agent


def test_unknown_host_settings_are_an_error(tmp_path: Path) -> None:
    from host_reconciler import settings

    with pytest.raises(GpuaasError) as e:
        settings.from_dict("n", {"libvirt_url": "typo"})
    assert e.value.code == "host.settings.unknown"


def test_demo_converges_two_example_nodes_injects_drift_and_reports_it(db_url: str) -> None:
    try:
        lab.check_host()
    except GpuaasError as e:
        pytest.skip(e.message)
    lines: list[str] = []
    demo.run_demo(db_url, out=lines.append)
    text = "\n".join(lines)
    assert "node h200-use1-s01  generation 2 (observed 2)  mode report  converged yes" in text
    assert "vm gpuaas-alloc-0006: active" in text
    for code in ("drift.reservation.missing", "drift.disk.mounted", "drift.domain.not_running", "drift.pci.not_vfio"):
        assert f"`{code}`" in text  # in the markdown drift report
    tail = text.split("drift left after self-heal")[1]
    assert "drift.reservation.missing" not in tail and "drift.domain.not_running" not in tail
    assert "drift.disk.mounted" in tail and "drift.pci.not_vfio" in tail


def test_converge_reads_its_plan_and_writes_its_status_as_the_node_role(
    lab: Lab, db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from host_reconciler import hostdb
    from tests.host.test_hostdb import add_node

    with hostdb.connect(db_url) as conn:
        add_node(conn, lab.node)
        central_plans.store(conn, [lab.plan(1, vms=(lab.vm("alloc-1", (0,)),))])
        creds = hostdb.create_node_role(conn, lab.node, "s3cret")
    monkeypatch.setenv("GPUAAS_HOST_DB_PASSWORD", creds.password)
    assert (
        cli.main(
            [
                "host",
                "converge",
                "--node",
                lab.node,
                "--config",
                str(lab.write_config()),
                "--db-url",
                db_url,
                "--db-role",
                creds.role,
            ]
        )
        == 0
    )
    assert "vm gpuaas-alloc-1: active" in capsys.readouterr().out
    with hostdb.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT slot_index, vm_state FROM host_slot_status WHERE node_name = %s ORDER BY slot_index", (lab.node,)
        ).fetchall()
    assert rows == [(0, "ready"), (1, "absent"), (2, "absent"), (3, "absent")]
