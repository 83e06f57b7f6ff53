"""End to end: a real guest boots on the management bridge, passes the gate, is released.

    host (this machine's own namespace)
    ┌──────────────────────────────────────────────────────────────────┐
    │ bridge gpe2eXXXX 10.213.77.1/24 ── dnsmasq (reservation file)    │
    │    └─ tap (libvirt, isolated port) ── qemu TCG guest             │
    │                                       eth0 52:54:00:e2:e0:01     │
    │                                       udhcpc → 10.213.77.10      │
    │                                       httpd on :22               │
    │ guest marker listener 10.213.77.1 ◀── the seed's announcer posts │
    │                                       name + token (busybox wget)│
    │ /dev/disk/by-id/gpuaas-e2e-*-slot0 → /dev/loopN (ext4) = sda     │
    └──────────────────────────────────────────────────────────────────┘

Provision: bridge + NAT + DHCP server, reservation, domain defined from the
host reconciler's own XML builder (direct kernel boot of the Debian kernel
with a busybox initramfs built here, carrying the cloud-init seed's
write_files), start, port isolation, readiness gate (lease with the reserved
IP, then TCP 22, then the guest marker /var/lib/gpuaas/slice-ready announced
by the seed's own announcer script). Release: graceful shutdown (the
guest's acpid powers off; hard stop after the timeout), undefine, reservation
removed (lease released), then the slot disk is wiped and verified with the
disk driver, after checking that it carried the guest's data.

Everything runs under a private libvirtd (own config, sockets, pid file, log)
and is torn down whatever happens.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from host_reconciler import cloudinit, devicereports, domains, pinning
from host_reconciler.drivers import disks, dnsmasq, guestmarker, network, protocols, readiness
from host_reconciler.drivers.libvirt_driver import LibvirtDomains
from host_reconciler.observations import DomainState
from schemas.hostplans import DiskIdentity, Network, SlotBundle, VmSpec

from . import guest

pytestmark = [pytest.mark.slow, pytest.mark.root]

SUBNET = "10.213.77.0/24"
MAC = "52:54:00:e2:e0:01"
VM_IP = "10.213.77.10"
READINESS_TIMEOUT_S = 240.0
GRACEFUL_TIMEOUT_S = 30.0


STAND_IN_UUID = "GPU-2f6c1d3e-8a4b-4c55-9d1e-0b7a6f3e2c11"
STAND_IN_NVIDIA_SMI = f"""#!/bin/sh
[ "$1" = -L ] || exit 2
echo "GPU 0: NVIDIA H200 (UUID: {STAND_IN_UUID})"
"""


def _skip_unless_possible() -> guest.Kernel:
    if os.geteuid() != 0:
        pytest.skip("needs root: bridge, loop devices, libvirtd")
    for tool in (
        "libvirtd",
        "virtlogd",
        "qemu-system-x86_64",
        "dnsmasq",
        "dhcp_release",
        "busybox",
        "losetup",
        "mkfs.ext4",
        "wipefs",
        "blkdiscard",
        "blkid",
    ):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (make apt installs it)")
    kernel = guest.find_kernel()
    if isinstance(kernel, str):
        pytest.skip(kernel)
    if any(
        ipaddress.ip_network(SUBNET).overlaps(ipaddress.ip_network(r.split()[0], strict=False))
        for r in subprocess.run(
            ["ip", "-4", "route", "show"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        if r.split() and r.split()[0] != "default"
    ):
        pytest.skip(f"{SUBNET} is already routed on this machine")
    return kernel


def _lab_xml(xml: str, console_log: Path) -> str:
    """The three changes a TCG lab needs to the production domain XML.

    - no <hostdev>: PCI passthrough cannot start on this machine;
    - CPU mode `maximum` instead of `host-passthrough`: TCG has no host CPU;
    - serial console to a file, so a failed boot shows its console in the test log.
    """
    root = ET.fromstring(xml)  # noqa: S314 -- XML we just built ourselves
    devices = root.find("devices")
    assert devices is not None
    for hostdev in devices.findall("hostdev"):
        devices.remove(hostdev)
    cpu = root.find("cpu")
    assert cpu is not None
    cpu.attrib = {"mode": "maximum"}
    for tag in ("serial", "console"):
        for el in devices.findall(tag):
            devices.remove(el)
    serial = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(serial, "source", path=str(console_log))
    ET.SubElement(serial, "target", port="0")
    return ET.tostring(root, encoding="unicode")


@contextlib.contextmanager
def _by_id_link(name: str, target: str) -> Iterator[str]:
    """/dev/disk/by-id/NAME -> target (no udev here to make one), removed afterwards."""
    by_id = Path("/dev/disk/by-id")
    made = [p for p in (by_id.parent, by_id) if not p.exists()]
    by_id.mkdir(parents=True, exist_ok=True)
    link = by_id / name
    link.symlink_to(target)
    try:
        yield str(link)
    finally:
        link.unlink(missing_ok=True)
        for p in reversed(made):
            with contextlib.suppress(OSError):
                p.rmdir()


def _read_at(device: str, offset: int, size: int) -> bytes:
    with open(device, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _console(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-6000:]
    except OSError:
        return "(no console log)"


@pytest.mark.timeout(600)
def test_e2e_guest_boots_gets_its_reservation_passes_readiness_and_is_wiped() -> None:
    kernel = _skip_unless_possible()
    timings: dict[str, float] = {}
    t_start = time.monotonic()
    tag = uuid.uuid4().hex[:8]
    bridge = f"gpe2e{tag[:6]}"
    net = Network(
        subnet=SUBNET,
        gateway="10.213.77.1",
        dhcp_start="10.213.77.10",
        dhcp_end="10.213.77.200",
        bridge=bridge,
    )

    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="gpuaas-e2e-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        work.chmod(0o755)  # qemu runs as libvirt-qemu and reads the kernel and initrd here

        # -- the slot disk: ext4 on a loop device, as an earlier tenant left it ----
        slot_file, os_file = work / "slot0.img", work / "os.img"
        for f, size in ((slot_file, 64 << 20), (os_file, 8 << 20)):
            with f.open("wb") as fh:
                fh.truncate(size)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(slot_file)], check=True)
        slot_loop = stack.enter_context(guest.loop_device(slot_file))
        os_loop = stack.enter_context(guest.loop_device(os_file))
        slot_disk_path = stack.enter_context(_by_id_link(f"gpuaas-e2e-{tag}-slot0", slot_loop))
        os_disk_path = stack.enter_context(_by_id_link(f"gpuaas-e2e-{tag}-os", os_loop))

        vmlinuz = work / "vmlinuz"
        shutil.copyfile(kernel.vmlinuz, vmlinuz)
        console_log = work / "console.log"

        # -- network: bridge, NAT, DHCP --------------------------------------------
        nets = network.LinuxBridgeNetwork()
        forward_before = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
        stack.callback(Path("/proc/sys/net/ipv4/ip_forward").write_text, forward_before)
        stack.callback(nets.remove_bridge, net)
        stack.callback(nets.remove_nat, net)
        t0 = time.monotonic()
        nets.ensure_bridge(net)
        nets.ensure_nat(net)
        server = dnsmasq.DnsmasqServer(work / "dnsmasq", lease_time="10m")
        stack.callback(server.stop)
        dhcp = dnsmasq.DnsmasqDhcp(server)
        dhcp.ensure_running(net)

        vm = VmSpec(
            allocation_id=f"e2e-{tag}",
            tenant="e2e",
            bundles=(
                SlotBundle(
                    slot_index=0,
                    gpu_pci_address="0000:00:00.0",  # dropped by _lab_xml: no passthrough here
                    fabric_vf_pci_address=None,
                    nvme_device=slot_disk_path,
                    mac_address=MAC,
                    private_ip=VM_IP,
                    numa_node=0,
                ),
            ),
            vcpu_count=1,
            memory_mib=512,
        )
        reservation = protocols.reservation_for(vm, net)
        assert dhcp.ensure_reservation(reservation) is True

        # -- guest boot files: the initramfs carries the seed's write_files -------------
        heard = guestmarker.Announcements(secrets.token_bytes(32), port=0)  # port 0: no clash with a real agent
        stack.callback(heard.close)
        gate = readiness.LeaseReadiness(server.lease_file, poll_s=0.5, announcements=heard)
        announce = gate.announce_for(vm.name, net.gateway)
        assert announce is not None
        seed = guest.seed_files(cloudinit.render(vm, announce=announce)["user-data"])
        assert cloudinit.ANNOUNCER in seed and cloudinit.ANNOUNCE_BODY in seed and cloudinit.DEVICES_HEAD in seed
        # The real nvidia-smi needs a GPU (no passthrough under TCG): a stand-in prints what it prints.
        seed["/usr/bin/nvidia-smi"] = (STAND_IN_NVIDIA_SMI.encode(), 0o755)
        initrd = work / "initrd.cpio"
        guest.build_initramfs(kernel, initrd, sector=guest.MARKER_OFFSET // 512, files=seed)

        # -- libvirt: private daemon, domain from the reconciler's builder ---------
        daemon = guest.Libvirtd(work / "libvirt")
        stack.callback(daemon.stop)
        daemon.start()
        doms = LibvirtDomains(daemon.uri)
        stack.callback(doms.close)
        stack.callback(doms.undefine, vm.name)
        stack.callback(doms.destroy, vm.name)
        options = domains.DomainOptions(
            domain_type="qemu",
            firmware="bios",
            direct_kernel=domains.DirectKernel(
                kernel=str(vmlinuz), initrd=str(initrd), cmdline="console=ttyS0 loglevel=4 panic=-1"
            ),
        )
        placement = pinning.place_vcpus(vm, vm.bundles, doms.topology())
        xml = domains.build(
            vm,
            network=net,
            placement=placement,
            options=options,
            digest=domains.spec_digest(vm, net, options),
        )
        qemu_log = Path(f"/var/log/libvirt/qemu/{vm.name}.log")
        stack.callback(qemu_log.unlink, missing_ok=True)
        doms.define(_lab_xml(xml, console_log))
        doms.start(vm.name)
        assert doms.state(vm.name) == DomainState.RUNNING
        assert "-accel tcg" in qemu_log.read_text()  # no KVM: the guest really runs under TCG
        assert nets.isolate_ports(net) != ()  # libvirt's tap joined as a plain port
        state = nets.observe(net)
        assert protocols.bridge_problems(net, state) == (), state
        timings["provision_s"] = time.monotonic() - t0

        # -- readiness gate: the reserved lease, then TCP 22, then the guest marker ---
        try:
            result = gate.wait_ready(
                MAC,
                VM_IP,
                22,
                READINESS_TIMEOUT_S,
                name=vm.name,
                gateway=net.gateway,
                expect=devicereports.Expectation(gpus=1, fabric_vfs=0),
            )
        except readiness.ReadinessTimeout as e:
            pytest.fail(
                f"{e.code}: {e.message}\n--- guest console ---\n{_console(console_log)}\n"
                f"--- dnsmasq log ---\n{server.log_file.read_text(errors='replace')[-3000:]}"
            )
        timings["lease_s"] = result.lease_s
        timings["ready_s"] = result.ready_s
        timings["devices_s"] = result.devices_s or 0.0
        assert result.devices is not None and result.devices["uuids"] == [STAND_IN_UUID]  # what the guest saw
        assert [(x.mac, x.ip) for x in dhcp.leases()] == [(MAC, VM_IP)]
        assert "gpuaas-e2e: ready" in _console(console_log)
        assert "gpuaas-e2e: marker /var/lib/gpuaas/slice-ready" in _console(console_log)
        marked = heard.heard(vm.name)
        assert marked is not None and marked.ip == VM_IP  # from the VM itself, with its own token

        # -- release -------------------------------------------------------------
        t1 = time.monotonic()
        doms.shutdown(vm.name)
        hard_stopped = False
        deadline = time.monotonic() + GRACEFUL_TIMEOUT_S
        while doms.state(vm.name) == DomainState.RUNNING:
            if time.monotonic() > deadline:
                doms.destroy(vm.name)
                hard_stopped = True
                break
            time.sleep(0.5)
        assert doms.state(vm.name) == DomainState.SHUTOFF
        timings["stop_s"] = time.monotonic() - t1
        doms.undefine(vm.name)
        assert doms.state(vm.name) is None

        assert dhcp.remove_reservation(vm.name) is True
        assert dhcp.reservations() == ()
        assert dhcp.leases() == ()  # released with the reservation

        # The disk the guest saw is the slot disk: its marker is there, ext4 too.
        assert _read_at(slot_loop, guest.MARKER_OFFSET, len(guest.MARKER)) == guest.MARKER
        blkid = subprocess.run(["blkid", "-p", slot_loop], check=False, capture_output=True, text=True)
        assert 'TYPE="ext4"' in blkid.stdout

        t2 = time.monotonic()
        driver = disks.BlockDisks(protocols.DiskSettings(sample_count=32))
        approval = DiskIdentity(size_bytes=64 << 20, backing_file=os.path.realpath(slot_file))
        slot = protocols.SlotDisk(0, slot_disk_path, approved=slot_disk_path, os_disk=os_disk_path, identity=approval)
        wiped = driver.wipe(slot)
        verified = driver.verify(slot)
        timings["wipe_verify_s"] = time.monotonic() - t2
        assert verified["verified"] is True, verified
        assert _read_at(slot_loop, guest.MARKER_OFFSET, len(guest.MARKER)) == bytes(len(guest.MARKER))
        assert wiped["signatures_before"], wiped  # ext4 was there before the wipe

    timings["total_s"] = time.monotonic() - t_start
    print(  # shown with -s; the numbers for the closing note
        "e2e timings: " + ", ".join(f"{k}={v:.1f}" for k, v in timings.items()) + f", hard_stopped={hard_stopped}"
    )
    assert not Path(f"/sys/class/net/{bridge}").exists()
