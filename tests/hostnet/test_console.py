"""The console end to end: a real WebSocket client, the gateway under uvicorn, libvirt's console stream,
and a TCG guest whose serial port runs a shell.

    websockets client ──ws──▶ uvicorn + ConsoleGateway ──libvirt (private libvirtd)──▶ qemu TCG guest
                                    │                                                   ttyS0: busybox sh
                                    └─ PostgreSQL: allocations (active), console_sessions (audit)

The domain comes from the host reconciler's own XML builder (its serial
console device included), minus what cannot run here (PCI passthrough, the
slot disk, the bridge NIC). The guest is booted once for the module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from host_reconciler import domains, pinning
from host_reconciler.drivers.libvirt_driver import LibvirtDomains
from reconciler.service import console
from reconciler.service.consolestreams import LibvirtConsoles
from reconciler.store import connections
from schemas.hostplans import Network, SlotBundle, VmSpec
from tests.service import consolelab as lab

from . import guest

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

ROOT = Path(__file__).resolve().parents[2]
INIT = """#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
echo "gpuaas-console: ready"
while true; do sh; done
"""
AUTH = {"Authorization": f"Bearer {lab.TOKENS['tenant']}"}


def _initramfs(dest: Path) -> None:
    busybox = shutil.which("busybox")
    assert busybox is not None
    cpio = guest._Cpio()
    for d in ("bin", "dev", "proc", "sys", "tmp"):
        cpio.dir(d)
    cpio.chardev("dev/console", 5, 1)
    cpio.file("bin/busybox", Path(busybox).read_bytes(), 0o755)
    cpio.file("init", INIT.encode(), 0o755)
    dest.write_bytes(cpio.bytes())


def _lab_xml(xml: str) -> str:
    """The product's domain XML without what cannot run here; its serial console stays as built."""
    root = ET.fromstring(xml)  # noqa: S314 -- XML we just built ourselves
    devices = root.find("devices")
    assert devices is not None
    for tag in ("hostdev", "disk", "interface"):
        for el in devices.findall(tag):
            devices.remove(el)
    cpu = root.find("cpu")
    assert cpu is not None
    cpu.attrib = {"mode": "maximum"}
    assert devices.find("serial") is not None and devices.find("console") is not None
    return ET.tostring(root, encoding="unicode")


def _quietly(call: object, *args: object) -> None:
    with contextlib.suppress(Exception):
        call(*args)  # type: ignore[operator]


def _start(daemon: guest.Libvirtd, wait_s: float = 180.0) -> None:
    """Start the private libvirtd; while another one on this machine (a concurrent test run) holds libvirt's
    fixed /run/libvirt/network/driver.pid, wait for it to finish rather than fail."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            daemon.start()
            return
        except TimeoutError as e:
            daemon.stop()
            if "driver.pid" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(3)


@pytest.fixture(scope="module")
def booted() -> Iterator[str]:
    """A TCG guest named as the gateway will look for it; yields its libvirt URI."""
    if os.geteuid() != 0:
        pytest.skip("needs root: libvirtd")
    for tool in ("libvirtd", "virtlogd", "qemu-system-x86_64", "busybox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (make apt installs it)")
    kernel = guest.find_kernel()
    if isinstance(kernel, str):
        pytest.skip(kernel)
    with contextlib.ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="gpuaas-console-"))
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        work.chmod(0o755)  # qemu reads the kernel and initrd as libvirt-qemu
        vmlinuz, initrd = work / "vmlinuz", work / "initrd.cpio"
        shutil.copyfile(kernel.vmlinuz, vmlinuz)
        _initramfs(initrd)
        daemon = guest.Libvirtd(work / "libvirt")
        stack.callback(daemon.stop)
        _start(daemon)
        doms = LibvirtDomains(daemon.uri)
        stack.callback(doms.close)
        vm = VmSpec(
            lab.ALLOC,
            lab.TENANT,
            (SlotBundle(0, "0000:00:00.0", None, "/dev/disk/by-id/none", "52:54:00:c0:00:01", "10.100.0.10", 0),),
            1,
            256,
        )
        for teardown in (doms.undefine, doms.destroy):  # the daemon may already be gone: nothing left to undo
            stack.callback(_quietly, teardown, vm.name)
        net = Network("10.100.0.0/24", "10.100.0.1", "10.100.0.10", "10.100.0.200", "gpcons0")
        options = domains.DomainOptions(
            domain_type="qemu",
            firmware="bios",
            direct_kernel=domains.DirectKernel(
                kernel=str(vmlinuz), initrd=str(initrd), cmdline="console=ttyS0 loglevel=1 panic=-1"
            ),
        )
        xml = domains.build(
            vm,
            network=net,
            placement=pinning.place_vcpus(vm, vm.bundles, doms.topology()),
            options=options,
            digest=domains.spec_digest(vm, net, options),
        )
        stack.callback(Path(f"/var/log/libvirt/qemu/{vm.name}.log").unlink, missing_ok=True)
        doms.define(_lab_xml(xml))
        doms.start(vm.name)
        yield daemon.uri


@pytest.fixture
def base(booted: str, db_url: str) -> Iterator[str]:
    lab.active_allocation(db_url)
    with lab.gateway(db_url, LibvirtConsoles(booted)) as url:
        yield url


def _shell(ws: object, command: bytes, want: bytes, timeout: float = 240.0) -> bytes:
    """Type `command` until the guest's shell prints `want` (the guest may still be booting)."""
    deadline = time.monotonic() + timeout
    seen = b""
    while time.monotonic() < deadline:
        ws.send(command)  # type: ignore[attr-defined]
        until = time.monotonic() + 3
        while time.monotonic() < until:
            try:
                seen += ws.recv(timeout=0.5)  # type: ignore[attr-defined]
            except TimeoutError:
                continue
            if want in seen:
                return seen
    raise AssertionError(f"no {want!r} on the console; saw {seen[-500:]!r}")


def test_a_tenant_types_into_its_vm_and_the_session_is_audited(base: str, db_url: str) -> None:
    sent = b"echo gpuaas-$((6*7))\n"
    with connect(lab.url(base), additional_headers=AUTH, open_timeout=30) as ws:
        transcript = _shell(ws, sent, b"gpuaas-42")
        assert b"echo gpuaas-$((6*7))" in transcript  # the guest's tty echoed what we typed
    deadline = time.monotonic() + 10
    while lab.sessions(db_url)[-1]["outcome"] == "open" and time.monotonic() < deadline:
        time.sleep(0.1)
    (row,) = lab.sessions(db_url)
    assert (row["principal"], row["role"], row["tenant"], row["node"]) == ("alice", "tenant", lab.TENANT, lab.NODE)
    assert row["outcome"] == "closed" and row["reason"] == "client left"
    assert row["bytes_in"] >= len(sent) and row["bytes_in"] % len(sent) == 0  # each retry counted
    assert row["bytes_out"] >= len(b"gpuaas-42") and row["duration_ms"] > 0


def test_the_session_is_cut_when_the_allocation_is_released(base: str, db_url: str) -> None:
    with connect(lab.url(base), additional_headers=AUTH, open_timeout=30) as ws:
        _shell(ws, b"echo still-$((1+1))\n", b"still-2")
        with connections.connect(db_url, autocommit=True) as conn:
            conn.execute("UPDATE allocations SET status = 'releasing' WHERE id = %s", (lab.ALLOC,))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == console.CLOSE_CUT
    (row,) = lab.sessions(db_url)
    assert (row["outcome"], row["reason"]) == ("cut", "allocation is releasing")


def test_bench_console_measures_the_keystroke_round_trip(base: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(lab.TOKENS["tenant"])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "reconciler.cli",
            "bench",
            "console",
            lab.url(base),
            "--token-file",
            str(token),
            "--keys",
            "20",
            "--json",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the figures (pytest -s shows them)
    doc = __import__("json").loads(done.stdout)
    assert doc["keys"] == 20 and doc["keystroke_rtt_p50_ms"] > 0
