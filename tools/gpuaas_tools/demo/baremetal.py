"""The baremetal part of `make demo`: whole-node leases through a real local Ironic (fake hardware).

The example fleet's us-east-1 nodes name the provider `ironic-use1` at
http://127.0.0.1:6385; this starts a standalone Ironic there (state under
the state dir), enrolls those machines through the real state machine and
gives each an SSH stand-in (a TCP listener on 127.0.0.1: fake hardware
boots nothing). Then, beside the slices:

1. in the claims demo's scratch database, a lease `demo-bm-0001` is
   deployed, goes active, is released and erased, and its node is
   available again, with the phase timings `history` records;
2. in the default database (the one the GitOps part applied), `alloc-0004`
   on h200-use1-b02 is deployed and left active, its usage accruing.

Ironic is stopped at the end; an active lease needs nothing from it until
its release.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from desired import models as m
from desired.state import DesiredState
from gpuaas_tools.lab import ironic_service, sshstandin
from reconciler import sources
from reconciler.reconcile import reconciling
from reconciler.store import connections, leases, lifecycle

Out = Callable[[str], None]
PROVIDER = "ironic-use1"
EXTRA = "demo-bm-0001"


def _heading(out: Out, text: str) -> None:
    out(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def run(fleet: Path, default_url: str, claims_url: str | None, out: Out = print) -> None:
    _heading(out, "baremetal leases: a local Ironic (fake-hardware) as the machine provider")
    venv = ironic_service.venv()
    loaded = sources.load(fleet)
    spec = next(
        (p for p in (loaded.state.fleet.machine_providers if loaded.state.fleet else ()) if p.name == PROVIDER), None
    )
    if venv is None or spec is None:
        out("skipped: " + ("Ironic is not installed (make deps)" if venv is None else f"no provider {PROVIDER}"))
        return
    port = int(spec.url.rsplit(":", 1)[1].split("/")[0])
    machines = sorted(
        n.machine.machine_id
        for n in loaded.state.nodes.values()
        if n.machine is not None and n.machine.provider == PROVIDER
    )
    ssh = sshstandin.SshStandIn()
    work = connections.state_dir() / "demo-ironic"
    if work.exists():
        shutil.rmtree(work)
    try:
        svc = ironic_service.IronicService(work, venv_dir=venv, port=port).start()
    except (RuntimeError, OSError) as e:
        out(f"skipped: Ironic did not start on 127.0.0.1:{port}: {e}")
        return
    try:
        t0 = time.perf_counter()
        svc.enroll(machines, addresses=dict.fromkeys(machines, ssh.address))
        out(
            f"Ironic at {svc.url}: enrolled {len(machines)} machines (enroll -> manage -> provide, cleaning) "
            f"-> available in {time.perf_counter() - t0:.1f} s: {', '.join(machines)}"
        )
        if claims_url:
            _deploy_and_release(claims_url, loaded.state, out)
        _leave_active(default_url, loaded.state, out)
    finally:
        svc.stop()
        ssh.close()


def _settle(url: str, state: DesiredState, done: Callable[[Any], bool], timeout: float = 120.0) -> None:
    with connections.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + timeout
        while not done(conn):
            if time.monotonic() > deadline:
                raise RuntimeError("the lease did not settle in time")
            reconciling.reconcile(conn, state, source="demo")
            time.sleep(0.2)


def _status(conn: Any, aid: str) -> str | None:
    row = conn.execute("SELECT status FROM allocations WHERE id = %s", (aid,)).fetchone()
    return str(row[0]) if row else None


def _show(url: str, aid: str, out: Out) -> None:
    with connections.connect(url, autocommit=True) as conn:
        lease = leases.details(conn, [aid])[aid]
        steps = lifecycle.transitions(conn, aid) or []
        usage = conn.execute("SELECT gpu_hours FROM allocation_usage WHERE allocation_id = %s", (aid,)).fetchone()
    t = lease["timings_s"]
    out(
        f"{aid}: {lease['phase']} on {lease['node']} via {lease['provider']}/{lease['machine_id']} "
        f"({lease['provider_state']}), ssh {lease['ssh_endpoint']}, deploy calls {lease['deploy_requests']}, "
        f"erase calls {lease['erase_requests']}"
    )
    out(f"  timings: deploy {t['deploy']} s, ssh {t['ssh']} s, to active {t['to_active']} s, erase {t['erase']} s")
    for s in steps:
        out(f"  {s.at.isoformat(timespec='seconds')}  {s.event:<30} {s.state:<12} {s.node or ''}")
    if usage is not None:
        out(f"  usage: {usage[0]} GPU-hours so far")


def _deploy_and_release(url: str, state: DesiredState, out: Out) -> None:
    _heading(out, f"a lease deployed and released (scratch database): {EXTRA}")
    base = state.allocations["alloc-0004"]
    extra = base.model_copy(update={"id": EXTRA})
    # alloc-0004 released here: the default database leases that one, on the same Ironic.
    state = _with_allocations(state, {"alloc-0004": base.model_copy(update={"state": m.AllocationState.RELEASED})})
    with_extra = _with_allocations(state, {EXTRA: extra})
    _settle(url, with_extra, lambda c: _status(c, EXTRA) == "active")
    released = _with_allocations(state, {EXTRA: extra.model_copy(update={"state": m.AllocationState.RELEASED})})
    _settle(url, released, lambda c: _status(c, EXTRA) == "released")
    _show(url, EXTRA, out)


def _leave_active(url: str, state: DesiredState, out: Out) -> None:
    _heading(out, "alloc-0004 on h200-use1-b02: deployed and left active (usage accruing)")
    _settle(url, state, lambda c: _status(c, "alloc-0004") == "active")
    _show(url, "alloc-0004", out)


def _with_allocations(state: DesiredState, extra: dict[str, m.Allocation]) -> DesiredState:
    return dataclasses.replace(state, allocations={**state.allocations, **extra})
