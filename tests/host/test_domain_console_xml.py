"""The slice domain XML carries a serial console (what the console gateway opens), valid for libvirt itself."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from host_reconciler import domains, pinning
from schemas.hostplans import Network, SlotBundle, VmSpec

NET = Network("10.100.0.0/24", "10.100.0.1", "10.100.0.10", "10.100.0.250", "gpuaasbr0")


def test_the_domain_has_a_serial_console_and_validates(tmp_path: Path) -> None:
    if shutil.which("virt-xml-validate") is None:
        pytest.skip("virt-xml-validate not installed (libvirt-clients)")
    vm = VmSpec(
        "alloc-c",
        "t",
        (
            SlotBundle(
                0, "0000:1b:00.0", "0000:1a:00.1", "/dev/disk/by-id/nvme-S0", "52:54:00:00:00:01", "10.100.0.10", 0
            ),
        ),
        4,
        4096,
    )
    topo = pinning.HostTopology(cells=(pinning.Cell(0, tuple(range(8))),))
    options = domains.DomainOptions()
    xml = domains.build(
        vm,
        network=NET,
        placement=pinning.place_vcpus(vm, vm.bundles, topo),
        options=options,
        digest=domains.spec_digest(vm, NET, options),
    )
    devices = ET.fromstring(xml).find("devices")  # noqa: S314 -- XML we just built
    assert devices is not None
    serial, cons = devices.find("serial"), devices.find("console")
    assert serial is not None and serial.get("type") == "pty"
    assert cons is not None and cons.find("target") is not None
    assert cons.find("target").get("type") == "serial"  # type: ignore[union-attr]
    assert devices.find("graphics") is None  # never a VNC or SPICE port on the node
    path = tmp_path / "domain.xml"
    path.write_text(xml)
    done = subprocess.run(["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
