"""The slot health step: after wipe and verify, reset the slot's GPU and VF, prove them back, unchanged.

    recorded H200 tree (examples/sysfs/build.py), read by the real SysfsPci:
    sys/bus/pci/devices/0000:1b:00.0/{vendor,device,subsystem_*,reset,driver->vfio-pci}   slot 0 GPU
    sys/bus/pci/devices/0000:1a:00.1/...                                                  slot 0 VF
    the writable `reset` file stands in for the device: "1" in it means the kernel was asked to reset.

A lab host (loop disks, libvirt test driver) releases a 2-slot VM; its PCI driver is SysfsPci on
the tree. Slots 2 and 3 are never claimed: their reset files stay empty.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from host_reconciler import converging, releasing
from host_reconciler.actions import Step
from host_reconciler.drivers import fakes, pci, protocols, wiring
from schemas.states import SlotStatus
from tests.host.conftest import SLOTS, Lab

BUILD = Path(__file__).resolve().parents[2] / "examples" / "sysfs" / "build.py"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    spec = importlib.util.spec_from_file_location("gpuaas_sysfs_build_health", BUILD)
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = build
    spec.loader.exec_module(build)
    host = next(h for h in build.hosts() if h.dirname == "xe9680l-h200")
    build.build(host, tmp_path / "h200")
    return tmp_path / "h200" / "sys"


def reset_file(tree: Path, address: str) -> Path:
    return tree / "bus" / "pci" / "devices" / address / "reset"


def converger(lab: Lab, driver: protocols.PciDriver) -> converging.Converger:
    s = lab.settings()
    drivers = wiring.drivers(s)
    drivers.pci = driver
    return converging.Converger(s, drivers)


def test_sysfs_reset_and_identity_on_the_recorded_tree(tree: Path) -> None:
    p = pci.SysfsPci(tree)
    gpu = p.identity("0000:1b:00.0")
    assert gpu is not None and gpu.vendor == "0x10de" and gpu.subsystem_vendor == "0x10de"
    assert p.reset("0000:1b:00.0") == {"reset": protocols.RESET_DONE, "methods": ["flr", "bus"]}
    assert reset_file(tree, "0000:1b:00.0").read_text() == "1"
    assert p.reset("0000:17:01.0") == {"reset": protocols.RESET_UNSUPPORTED}  # a root port: no reset offered
    assert p.identity("0000:ff:00.0") is None


def test_release_resets_only_the_claimed_devices_and_records_the_evidence(lab: Lab, tree: Path) -> None:
    c = converger(lab, pci.SysfsPci(tree))
    vm = lab.vm("alloc-h", (0, 1), vcpus=4, memory_mib=2048)
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        r = c.converge(lab.plan(2, releases=(vm,)))
        assert not r.errors, r.errors
        assert {s.slot_index: s.state for s in r.status.slots}[0] is SlotStatus.AVAILABLE
        claimed = {a for _, gpu, vf, _ in SLOTS[:2] for a in (gpu, vf)}
        for _, gpu, vf, _ in SLOTS:
            for address in (gpu, vf):
                f = reset_file(tree, address)
                if f.exists():
                    assert f.read_text() == ("1" if address in claimed else ""), address
        rep = next(s for s in r.status.slots if s.slot_index == 1)
        health = rep.wipe_evidence["health"]
        assert health["ok"] is True and [d["role"] for d in health["devices"]] == ["gpu", "fabric_vf"]
        assert {d["address"] for d in health["devices"]} == {SLOTS[1][1], SLOTS[1][2]}
        assert all(d["reset"] == "reset" and d["driver"] == "vfio-pci" for d in health["devices"])
        timing = [ms for a, ms in r.executed if a.step is Step.SLOT_HEALTH]
        assert len(timing) == 2
    finally:
        c.drivers.close()


def test_a_device_not_back_on_vfio_blocks_that_slot_only(lab: Lab, tree: Path) -> None:
    c = converger(lab, pci.SysfsPci(tree))
    vm = lab.vm("alloc-h", (0, 1), vcpus=4, memory_mib=2048)
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        link = tree / "bus" / "pci" / "devices" / SLOTS[1][1] / "driver"  # a host driver took slot 1's GPU
        link.unlink()
        (tree / "bus" / "pci" / "drivers" / "nvidia").mkdir(parents=True, exist_ok=True)
        link.symlink_to(tree / "bus" / "pci" / "drivers" / "nvidia")
        r = c.converge(lab.plan(2, releases=(vm,)))
        states = {s.slot_index: s.state for s in r.status.slots}
        assert states[0] is SlotStatus.AVAILABLE and states[1] is SlotStatus.CLEANUP_BLOCKED
        bad = next(s for s in r.status.slots if s.slot_index == 1)
        assert bad.wipe_state == "failed" and (bad.wipe_error or "").startswith("host.health.not_vfio")
        assert bad.wipe_evidence["health"]["devices"][0]["driver"] == "nvidia"
        assert c.state.read_leases() == {1: "alloc-h"}  # the blocked slot keeps its lease
    finally:
        c.drivers.close()


class ShapeShifter(fakes.FakePci):
    """A GPU whose subsystem ids change across its reset (a different board answered)."""

    def reset(self, address: str) -> dict[str, object]:
        out = super().reset(address)
        if address == SLOTS[0][1]:
            self.identities[address] = protocols.PciIdentity("0x10de", "0x2335", "0x10de", "0x0000")
        return out


def test_an_identity_change_across_the_reset_blocks_the_slot(lab: Lab) -> None:
    fake = ShapeShifter(all_present=True)
    c = converger(lab, fake)
    vm = lab.vm("alloc-h", (0,))
    try:
        assert not c.converge(lab.plan(1, vms=(vm,))).errors
        r = c.converge(lab.plan(2, releases=(vm,)))
        slot = next(s for s in r.status.slots if s.slot_index == 0)
        assert slot.state is SlotStatus.CLEANUP_BLOCKED
        assert (slot.wipe_error or "").startswith("host.health.identity_changed")
        assert slot.wipe_evidence["health"]["devices"][0]["identity_after"]["subsystem_device"] == "0x0000"
        assert fake.resets == [SLOTS[0][1]]  # the VF was not reached after the GPU failed
    finally:
        c.drivers.close()


def test_no_reset_of_a_device_outside_the_claim(lab: Lab) -> None:
    fake = fakes.FakePci(all_present=True)
    c = converger(lab, fake)
    vm = lab.vm("alloc-h", (0,))
    ctx = c.context(lab.plan(1, releases=(vm,)))
    with pytest.raises(protocols.PciError) as e:
        releasing.reset_claimed(ctx, vm, 0, SLOTS[2][1])  # slot 2's GPU: another slot's device
    assert e.value.code == "host.health.not_claimed" and fake.resets == []
    with pytest.raises(protocols.PciError):
        releasing.reset_claimed(ctx, vm, 1, SLOTS[1][1])  # slot 1 is not in this claim at all
    assert releasing.claimed_devices(vm, 0) == (("gpu", SLOTS[0][1]), ("fabric_vf", SLOTS[0][2]))
    c.drivers.close()
