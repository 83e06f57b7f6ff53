"""A host reconciler process killed at every phase, restarted, converges and leaks nothing.

    libvirtd (a private daemon, run as nobody) serving libvirt's test driver:
    domains outlive the reconciler process, as they do on a host.

    for each phase P of provision and release:
        reconciler --plan run  --SIGKILL at P-->  (half-done state)
        reconciler --plan run  ----------------->  converged
        check: domains, DHCP reservations, slot leases, seed dirs are exactly
               what the plan asks for (after release: none, disk wiped and verified)

A kill "done" lands after the step's effect and before it is journaled, the
worst moment; "start" lands before the step begins.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest

from host_reconciler import converging
from host_reconciler.actions import PROVISION_STEPS, RELEASE_STEPS, Action, Step
from host_reconciler.drivers import wiring
from schemas import hostplans
from tests.host.conftest import Lab, Loops, make_lab, need_root


@pytest.fixture(scope="module")
def libvirtd_test() -> Iterator[str]:
    """A libvirtd of our own (run as nobody, private dirs) serving `test:///default`."""
    need_root("libvirtd", "setpriv")
    root = Path(tempfile.mkdtemp(prefix="gpuaas-lvd-", dir="/tmp"))
    for sub in ("home", "run", "config", "cache"):
        (root / sub).mkdir()
    shutil.chown(root, user="nobody")
    for p in root.iterdir():
        shutil.chown(p, user="nobody")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin:/usr/sbin:/sbin"),
        "HOME": str(root / "home"),
        "XDG_RUNTIME_DIR": str(root / "run"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "XDG_CACHE_HOME": str(root / "cache"),
    }
    log = (root / "libvirtd.log").open("wb")
    proc = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "libvirtd", "--timeout", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    sock = root / "run" / "libvirt" / "libvirt-sock"
    uri = f"test+unix:///default?socket={sock}"
    keeper = None
    try:
        for _ in range(100):
            if sock.exists() and proc.poll() is None:
                try:
                    keeper = libvirt.open(uri)  # keeps the daemon's test driver state alive
                    break
                except libvirt.libvirtError:
                    pass
            time.sleep(0.1)
        if keeper is None:
            pytest.skip(f"libvirtd did not start: {(root / 'libvirtd.log').read_text()[-500:]}")
        yield uri
    finally:
        if keeper is not None:
            keeper.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def kill_lab(tmp_path: Path, loops: Loops, netns: str, libvirtd_test: str) -> Lab:
    return make_lab(tmp_path, loops, netns, slots=2, libvirt_uri=libvirtd_test, disk_mb=8)


def reconciler(lab: Lab, plan: hostplans.HostPlan, kill: tuple[str, str] | None = None) -> int:
    """Run one pass in a new process (forked: the modules are already imported); return its status.

    With `kill` the process SIGKILLs itself at that step, as an OOM kill or a power cut would.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the host reconciler process
        code = 3
        try:
            os.close(read)
            s = lab.settings()

            def hook(action: Action, when: str) -> None:
                if kill is not None and (str(action.step), when) == kill:
                    os.kill(os.getpid(), signal.SIGKILL)

            drivers = wiring.drivers(s)
            result = converging.Converger(s, drivers, on_step=hook).converge(plan)
            drivers.close()
            report = {"errors": [e.as_dict() for e in result.errors], "converged": result.status.converged}
            os.write(write, json.dumps(report).encode())
            code = 0
        except BaseException as e:
            os.write(write, json.dumps({"crash": repr(e)}).encode())
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    if kill is None:
        assert rc == 0 and json.loads(out) == {"errors": [], "converged": True}, out
    return rc


def world(lab: Lab, uri: str) -> dict[str, object]:
    """Everything a leak could hide in: libvirt domains, reservation files, leases, seed dirs."""
    state = Path(lab.settings_doc["state_dir"])
    conn = libvirt.open(uri)
    try:
        doms = sorted(d.name() for d in conn.listAllDomains(0) if d.name().startswith("gpuaas-"))
    finally:
        conn.close()
    hosts = state / "dnsmasq" / "hosts"
    leases = state / "leases"
    seeds = state / "seeds"
    return {
        "domains": doms,
        "reservations": sorted(p.name for p in hosts.iterdir()) if hosts.exists() else [],
        "leases": sorted(p.name for p in leases.iterdir()) if leases.exists() else [],
        "seeds": sorted(p.name for p in seeds.iterdir()) if seeds.exists() else [],
    }


def kill_points() -> list[tuple[tuple[str, str], tuple[str, str]]]:
    # The ingress steps run only for a plan with public endpoints (this lab has no ingress driver).
    provision = [(str(s), "done") for s in PROVISION_STEPS if s is not Step.INGRESS]
    release = [(str(s), "done") for s in RELEASE_STEPS if s is not Step.REMOVE_INGRESS]
    release += [(str(RELEASE_STEPS[0]), "start")]
    release += [(str(RELEASE_STEPS[-1]), "start")]
    provision += [(str(PROVISION_STEPS[0]), "start")]
    n = max(len(provision), len(release))
    return [(provision[i % len(provision)], release[i % len(release)]) for i in range(n)]


def test_kill_at_every_phase_then_restart_converges_without_leaks(kill_lab: Lab, libvirtd_test: str) -> None:
    lab = kill_lab
    for i, (p_kill, r_kill) in enumerate(kill_points()):
        alloc = f"alloc-k{i}"
        vm = lab.vm(alloc, (0,))
        running = lab.plan(2 * i + 1, vms=(vm,))
        released = lab.plan(2 * i + 2, releases=(vm,))
        name = hostplans.vm_name(alloc)
        # Every round fetches its image again (else the cache proves image_fetch and it never runs).
        shutil.rmtree(Path(lab.settings_doc["image_dir"]) / "sha256", ignore_errors=True)

        assert reconciler(lab, running, p_kill) == -signal.SIGKILL, f"not killed at {p_kill}"
        reconciler(lab, running)
        assert world(lab, libvirtd_test) == {
            "domains": [name],
            "reservations": [name],
            "leases": ["slot-0.json"],
            "seeds": [name],
        }, f"after a kill at provision {p_kill}"

        assert reconciler(lab, released, r_kill) == -signal.SIGKILL, f"not killed at {r_kill}"
        reconciler(lab, released)
        assert world(lab, libvirtd_test) == {"domains": [], "reservations": [], "leases": [], "seeds": []}, (
            f"after a kill at release {r_kill}"
        )
        wipe = json.loads((Path(lab.settings_doc["state_dir"]) / "wipes" / "slot-0.json").read_text())
        assert (wipe["allocation_id"], wipe["verified"], wipe["blocked"]) == (alloc, True, None)
        assert lab.slot_disks[0].backing.read_bytes().count(0) == 8 << 20  # really zero
    out = subprocess.run(["blkid", "-p", lab.os_disk.device], capture_output=True, text=True, check=False)
    assert 'TYPE="ext4"' in out.stdout  # the OS disk was never touched
