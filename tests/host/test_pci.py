"""PCI/VFIO check on sysfs trees: read-only unless the host opts in to binding.

<root>/bus/pci/devices/0000:1b:00.0/driver -> ../../drivers/nvidia     (not vfio-pci)
<root>/bus/pci/devices/0000:1a:00.1/driver -> ../../drivers/vfio-pci
<root>/bus/pci/devices/0000:1a:00.1/numa_node = 0
"""

from __future__ import annotations

from pathlib import Path

import pytest

from host_reconciler.drivers import pci, protocols
from host_reconciler.drivers.fakes import FakePci
from host_reconciler.observations import PciObs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sysfs" / "xe9680l-h200" / "sys"


def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    drivers = root / "bus" / "pci" / "drivers"
    for d in ("nvidia", "vfio-pci"):
        (drivers / d).mkdir(parents=True)
    for addr, drv in (("0000:1b:00.0", "nvidia"), ("0000:1a:00.1", "vfio-pci")):
        dev = root / "bus" / "pci" / "devices" / addr
        dev.mkdir(parents=True)
        (dev / "driver").symlink_to(drivers / drv)
        (dev / "numa_node").write_text("0\n")
    return root


def test_reads_driver_and_numa_node(tmp_path: Path) -> None:
    p = pci.SysfsPci(tree(tmp_path))
    assert p.inspect("0000:1a:00.1") == PciObs("0000:1a:00.1", True, "vfio-pci", 0)
    assert p.inspect("0000:1b:00.0").driver == "nvidia"
    assert not p.inspect("0000:ff:00.0").present


def test_binding_is_refused_unless_the_host_allows_it(tmp_path: Path) -> None:
    root = tree(tmp_path)
    with pytest.raises(protocols.PciError) as e:
        pci.SysfsPci(root).bind_vfio("0000:1b:00.0")
    assert e.value.code == "host.pci.not_vfio"
    assert not (root / "bus/pci/devices/0000:1b:00.0/driver_override").exists()  # nothing written


def test_binding_writes_the_kernel_interface_when_allowed(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / "bus/pci/drivers/nvidia/unbind").write_text("")
    (root / "bus/pci/drivers_probe").write_text("")
    with pytest.raises(protocols.PciError) as e:  # a sysfs tree is not a kernel: nothing rebinds
        pci.SysfsPci(root, allow_bind=True).bind_vfio("0000:1b:00.0")
    assert e.value.code == "host.pci.bind_failed"
    assert (root / "bus/pci/devices/0000:1b:00.0/driver_override").read_text() == "vfio-pci"
    assert (root / "bus/pci/drivers/nvidia/unbind").read_text() == "0000:1b:00.0"


@pytest.mark.parametrize("address", ["0000:1b:00.0;reboot", "../../etc", "1b:00.0"])
def test_addresses_are_validated_before_any_path_is_built(tmp_path: Path, address: str) -> None:
    with pytest.raises(protocols.PciError):
        pci.SysfsPci(tree(tmp_path)).inspect(address)


@pytest.mark.skipif(not EXAMPLE.exists(), reason="recorded sysfs tree not present")
def test_recorded_h200_host_has_its_gpus_and_vfs_on_vfio() -> None:
    p = pci.SysfsPci(EXAMPLE)
    assert p.inspect("0000:1b:00.0").driver == "vfio-pci"
    assert p.inspect("0000:1a:00.1").present


def test_fake_follows_the_same_rules() -> None:
    fake = FakePci(["0000:1b:00.0"], driver="nvidia")
    with pytest.raises(protocols.PciError):
        fake.bind_vfio("0000:1b:00.0")
    fake.allow_bind = True
    fake.bind_vfio("0000:1b:00.0")
    assert fake.inspect("0000:1b:00.0").driver == "vfio-pci"


@pytest.mark.skipif(not EXAMPLE.exists(), reason="recorded sysfs tree not present")
def test_discovery_gate_runs_on_every_pass_and_blocks_only_the_swapped_disk(tmp_path: Path) -> None:
    import yaml

    from gpuaas_tools.lab import host as lab
    from host_reconciler import context, diff, observing
    from host_reconciler.settings import HostSettings
    from schemas import hostplans
    from tests.host.conftest import NETWORK

    doc = yaml.safe_load((EXAMPLE.parents[2] / "fleet" / "slotmaps" / "h200-use1-s01.yaml").read_text())
    slots = tuple(
        hostplans.SlotBundle(
            s["slot_index"],
            s["gpu_pci_address"],
            s["fabric_vf_pci_address"],
            s["nvme_device"],
            s["mac_address"],
            s["private_ip"],
            s["numa_node"],
        )
        for s in doc["slots"]
    )
    plan = hostplans.HostPlan("h200-use1-s01", 1, NETWORK, "/dev/disk/by-id/nvme-Dell_BOSS-N1_S6EXNA0W1OS", slots=slots)
    # The host's slot-5 disk was swapped for another one (new serial, new by-id names).
    tree = lab.retag_tree(EXAMPLE.parent, tmp_path / "host", "S6EXNA0W105", "S6EXNA0W199")
    settings = HostSettings(node="h200-use1-s01", discovery_root=tree, state_dir=tmp_path / "state")
    ctx = context.Context(plan, settings, None, None)  # type: ignore[arg-type] -- the gate reads no driver
    findings, ran = observing._gate(ctx)
    assert ran and {f.slot_index for f in findings} == {5}
    assert findings[0].expected == "/dev/disk/by-id/nvme-SAMSUNG_MZWLR3T8HBLS-00007_S6EXNA0W105"
    drift = diff.drift(plan, observing.HostObservation(gate=findings, gate_ran=True))
    assert [(d.slot_index, str(d.code)) for d in drift] == [(5, "drift.identity.changed")]
