"""`gpuaas host discover` on this machine's real /sys, user mistakes, and the benchmark."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from host_reconciler.discovery import sysfs
from reconciler import cli

pytestmark = pytest.mark.integration  # real git repositories and subprocesses

PACKAGE = Path(__file__).resolve().parents[2] / "host_reconciler" / "discovery"


def _real_gpus() -> int:
    """GPUs this machine has, counted without the discovery code (usually none here)."""
    count = 0
    base = "/sys/bus/pci/devices"
    for addr in os.listdir(base):
        with open(f"{base}/{addr}/vendor") as v, open(f"{base}/{addr}/class") as c:
            vendor, cls = v.read().strip(), c.read().strip()
        count += vendor in ("0x10de", "0x1002") and cls[2:6] in ("0300", "0302", "0380", "1200")
    return count


def test_real_sys_exits_zero_and_lists_prerequisites(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["host", "discover", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    doc = json.loads(out)
    found = doc["discovery"]
    assert len(found["gpus"]) == _real_gpus()
    if not found["gpus"]:
        assert doc["candidate"] is None
    names = [p["name"] for p in found["prerequisites"]]
    assert names == ["iommu", "kvm", "vfio_pci", "libvirt", "ovs", "reboot", "hugepages"]
    assert all(isinstance(p["ok"], bool) and p["detail"] for p in found["prerequisites"])
    assert found["numa_nodes"] and found["numa_nodes"][0]["cpus"]
    assert cli.main(["host", "discover"]) == 0
    text = capsys.readouterr().out
    assert "# prerequisites:" in text and "iommu" in text
    if not found["gpus"]:
        assert "no GPU found" in text and "apiVersion" not in text


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["host", "discover", "--sysfs-root", "/nonexistent/root"], sysfs.ROOT_MISSING),
        (["host", "discover", "--sysfs-root", "/sys"], sysfs.ROOT_NOT_SYSFS),
        (["host", "discover", "--sysfs-root", "/"], None),
        (["host", "discover", "--node", "Bad Name"], "discovery.node.invalid"),
        (["host", "gate", "/nonexistent.yaml"], "gate.slotmap.invalid"),
        (["bench", "discover", "--runs", "0"], "cli.usage"),
        (["bench", "discover", "--examples", "/nonexistent/examples"], "bench.discover.no_tree"),
    ],
)
def test_user_mistakes_are_coded_errors_not_tracebacks(
    argv: list[str], code: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(argv)
    _, err = capsys.readouterr()
    if code is None:
        assert status == 0
        return
    assert status == 1
    assert err.startswith(f"error: {code}: ") and "Traceback" not in err


def test_gate_refuses_a_file_that_is_not_a_slot_map(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.yaml"
    bad.write_text("apiVersion: gpuaas.io/v1alpha1\nkind: SlotMap\nnode: n1\nslots: []\n")
    assert cli.main(["host", "gate", str(bad)]) == 1
    assert "error: gate.slotmap.invalid: " in capsys.readouterr().err


def test_bench_prints_the_figure(trees: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "discover", "--sysfs-root", str(trees["xe9680l-h200"]), "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "8 GPUs" in out and "goal <= 200 ms per 8-GPU host" in out


def test_bench_finds_the_recorded_tree_under_examples(
    trees: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--examples, not this module's place on disk, says where the recorded trees are."""
    (tmp_path / "sysfs").mkdir()
    (tmp_path / "sysfs" / "xe9680l-h200").symlink_to(trees["xe9680l-h200"])
    assert cli.main(["bench", "discover", "--examples", str(tmp_path), "--runs", "1"]) == 0
    assert "8 GPUs" in capsys.readouterr().out


def test_discovery_never_shells_out_or_writes() -> None:
    for path in PACKAGE.glob("*.py"):
        text = path.read_text()
        assert "subprocess" not in text and not re.search(r"shell\s*=\s*True", text), path
        assert "O_WRONLY" not in text and "O_RDWR" not in text and '"w"' not in text, path
