"""Run baremetal leases through their machine provider: deploy once, readiness, release with erase.

Each reconciliation calls `step`: for every node_exclusive claim on a node
that declares `machine:` (and every lease row not yet finished) it moves
the lease one phase at most, through the same durable machinery as slices:

    reserved: the deploy request is written and committed first, then, under
      the lease row's lock (FOR UPDATE SKIP LOCKED: a second reconciler skips
      it), the provider is read: a machine already deploying or deployed for
      this allocation is adopted, a free one is deployed (once);
    deploying: the provider reports it deployed AND its SSH port answers ->
      active (the claim and allocation follow, usage starts: `gpuaas_absorb_leases`);
      a failed deploy -> the machine quarantined with the provider's message,
      and `gpuaas_reschedule` places the allocation again elsewhere;
    releasing claim: the release is written first, then the provider releases
      the machine with an erase per the node's wipe policy (once); when the
      provider reports it erased, the erase result is the cleanup evidence that
      `gpuaas_free_cleaned` accepts; a failed erase leaves the node blocked.

A provider that does not answer leaves the lease where it is with
`baremetal.provider.unreachable` in its status: no second deploy, nothing
released. Machines the provider reports deployed that no lease of ours
deployed, and declared machines it does not know, are drift for operators.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from desired.state import DesiredState
from reconciler import codes as reconciler_codes
from reconciler.providers import probes
from reconciler.providers import protocols as pr
from reconciler.providers.registry import Providers
from reconciler.store import cleanup, leases
from reconciler.store.connections import Connection
from schemas import dberrors
from schemas.errors import GpuaasError, PermanentError

Fault = Callable[[str], None]  # tests: called at named points ("deploy.sent", "erase.sent") to kill the loop


@dataclass
class StepResult:
    moved: list[tuple[str, str]] = field(default_factory=list)  # (allocation_id, new phase)
    waiting: list[tuple[str, str]] = field(default_factory=list)  # (allocation_id, code)
    absorbed: int = 0
    freed: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.moved or self.absorbed or self.freed)


def step(
    conn: Connection,
    state: DesiredState,
    providers: Providers,
    *,
    probe: pr.SshProbe | None = None,
    fault: Fault | None = None,
    scan_drift: bool = True,
) -> StepResult:
    probe = probe or probes.TcpProbe()
    result = StepResult()
    served = {name: n.machine for name, n in state.nodes.items() if n.machine is not None}
    for w in leases.work(conn, served):
        spec = served.get(w.node)
        if w.claim_status != "releasing" and not w.wanted and w.phase in (None, "deploy_requested"):
            continue  # no longer declared (orphaned): never deploy it; a release in git undoes it
        if w.phase is None and (spec is None or w.claim_status == "releasing"):
            continue  # never deployed by us (released before the first step): nothing to undo here
        try:
            if w.phase is None and spec is not None:
                leases.request_deploy(conn, w, spec.provider, spec.machine_id, spec.wipe_policy)
            moved = _advance(conn, w, state, providers, probe, fault)
        except pr.ProviderUnreachable as e:
            leases.wait(conn, w.claim_id, e.code, e.message)
            result.waiting.append((w.allocation_id, e.code))
            continue
        except PermanentError as e:
            leases.wait(conn, w.claim_id, e.code, e.message)
            result.waiting.append((w.allocation_id, e.code))
            continue
        if moved:
            result.moved.append((w.allocation_id, moved))
    result.absorbed = leases.absorb(conn)
    result.freed = sum(1 for f in cleanup.free_cleaned(conn) if f.outcome in ("freed", "released"))
    leases.settle_profile_debts(conn)
    if scan_drift:
        _drift(conn, state, providers)
    return result


def _advance(  # noqa: PLR0917
    conn: Connection,
    w: leases.Work,
    state: DesiredState,
    providers: Providers,
    probe: pr.SshProbe,
    fault: Fault | None,
) -> str | None:
    """Move one lease at most one phase, under its row lock; returns the new phase (None: unchanged)."""
    with dberrors.wrapped(f"advance the lease of {w.allocation_id}"), conn.transaction():
        lease = leases.lock(conn, w.claim_id)
        if lease is None or lease.phase in ("erased", "erase_failed"):
            return None  # another reconciler holds it, or it is finished
        provider = providers.get(lease.provider)
        if provider is None:
            raise PermanentError(
                f"machine provider {lease.provider} is not declared in Fleet.machine_providers",
                code=reconciler_codes.BAREMETAL_PROVIDER_UNDECLARED,
            )
        if w.claim_status == "releasing":
            return _release(conn, lease, provider, fault)
        return _deploy(conn, lease, w, state, provider, probe, fault)


def _deploy(  # noqa: PLR0911, PLR0917
    conn: Connection,
    lease: leases.Lease,
    w: leases.Work,
    state: DesiredState,
    provider: pr.MachineProvider,
    probe: pr.SshProbe,
    fault: Fault | None,
) -> str | None:
    if lease.phase not in ("deploy_requested", "deploying"):
        return None  # active (nothing to do) or deploy_failed (the reschedule releases it)
    machine = provider.machine(lease.machine_id)
    ours = machine.allocation_id == lease.allocation_id
    if lease.phase == "deploy_requested":
        if machine.state in (pr.MachineState.DEPLOYING, pr.MachineState.DEPLOYED) and ours:
            # Our request reached the provider before a restart: adopt it, never deploy twice.
            leases.move(conn, lease, "deploying", provider_state=machine.provider_state, adopted=True)
            _owe_profile(conn, state, lease)
            return "deploying"
        if machine.state is not pr.MachineState.READY or (machine.allocation_id not in (None, lease.allocation_id)):
            raise PermanentError(
                f"{lease.provider} machine {lease.machine_id} is {machine.provider_state}"
                + (f" for {machine.allocation_id}" if machine.allocation_id and not ours else "")
                + ": not free for a deploy",
                code=reconciler_codes.BAREMETAL_MACHINE_BUSY,
            )
        request = _deploy_request(w, lease)
        try:
            after = provider.deploy(request)
        except pr.ProviderRefused as e:
            leases.move(conn, lease, "deploy_failed", provider_state=machine.provider_state, message=e.message)
            leases.quarantine(conn, lease, pr.DEPLOY_FAILED, e.message)
            return "deploy_failed"
        if fault:
            fault("deploy.sent")
        leases.move(conn, lease, "deploying", provider_state=after.provider_state, sent="deploy")
        _owe_profile(conn, state, lease)
        return "deploying"
    # deploying: wait for the provider, then for SSH.
    if machine.state is pr.MachineState.DEPLOY_FAILED or (machine.state is pr.MachineState.READY and not ours):
        why = machine.message or f"the provider reports the machine {machine.provider_state}"
        leases.move(conn, lease, "deploy_failed", provider_state=machine.provider_state, message=why)
        leases.quarantine(conn, lease, pr.DEPLOY_FAILED, why)
        return "deploy_failed"
    if machine.state is pr.MachineState.MISSING:
        raise PermanentError(f"{lease.provider} no longer knows machine {lease.machine_id}", code=pr.MACHINE_MISSING)
    if machine.state is not pr.MachineState.DEPLOYED:
        leases.note(conn, lease, provider_state=machine.provider_state)
        return None
    node = state.nodes.get(lease.node_name)
    address = (
        node.machine.ssh_address
        if node and node.machine and node.machine.ssh_address
        else (machine.addresses[0] if machine.addresses else None)
    )
    if address is None:
        leases.note(conn, lease, provider_state=machine.provider_state, deployed=True)
        leases.wait(conn, lease.claim_id, pr.SSH_WAITING, "the provider reports no address for the machine")
        return None
    host, port = probes.endpoint(address)
    endpoint = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    if not probe.answers(host, port):
        leases.note(conn, lease, provider_state=machine.provider_state, deployed=True, ssh_endpoint=endpoint)
        leases.wait(conn, lease.claim_id, pr.SSH_WAITING, f"deployed; SSH at {endpoint} does not answer yet")
        return None
    leases.move(conn, lease, "active", provider_state=machine.provider_state, deployed=True, ssh_endpoint=endpoint)
    return "active"


def _release(  # noqa: PLR0911
    conn: Connection,
    lease: leases.Lease,
    provider: pr.MachineProvider,
    fault: Fault | None,
) -> str | None:
    if lease.phase not in ("release_requested", "erasing"):
        # The release is recorded first; the provider call follows in the next step (a kill in
        # between leaves release_requested, which is read back before any call).
        leases.move(conn, lease, "release_requested")
        return "release_requested"
    request = pr.ReleaseRequest(
        lease.allocation_id, lease.machine_id, "secure_erase" if lease.wipe_policy == "secure_erase" else "quick_erase"
    )
    machine = provider.machine(lease.machine_id)
    if lease.phase == "release_requested":
        if machine.state is pr.MachineState.RELEASING or (
            machine.state is pr.MachineState.READY
            and lease.erase_requests == 0
            and lease.deploy_requests + lease.adopted > 0
            and machine.allocation_id is None
        ):
            # Released before a restart (or already erased): adopt, never erase twice.
            leases.move(conn, lease, "erasing", provider_state=machine.provider_state, adopted=True)
            return "erasing"
        if machine.state is pr.MachineState.READY and machine.allocation_id is None:
            # Never deployed (released before the deploy reached the provider): nothing was written to it.
            evidence = {
                "provider": lease.provider,
                "machine_id": lease.machine_id,
                "verified": True,
                "method": "never_deployed",
                "provider_state": machine.provider_state,
            }
            leases.move(conn, lease, "erased", provider_state=machine.provider_state, evidence=evidence)
            return "erased"
        if machine.state is pr.MachineState.MISSING:
            raise PermanentError(
                f"{lease.provider} no longer knows machine {lease.machine_id}", code=pr.MACHINE_MISSING
            )
        after = provider.release(request)
        if fault:
            fault("erase.sent")
        leases.move(conn, lease, "erasing", provider_state=after.provider_state, sent="erase")
        return "erasing"
    if machine.state is pr.MachineState.ERASE_FAILED:
        ev = provider.erase_evidence(machine, request)
        leases.move(
            conn,
            lease,
            "erase_failed",
            provider_state=machine.provider_state,
            message=machine.message or f"the provider reports {machine.provider_state}",
            evidence=_evidence(lease, ev),
        )
        return "erase_failed"
    if machine.state is pr.MachineState.READY:
        ev = provider.erase_evidence(machine, request)
        leases.move(
            conn,
            lease,
            "erased" if ev.verified else "erase_failed",
            provider_state=machine.provider_state,
            message=ev.message,
            evidence=_evidence(lease, ev),
        )
        return "erased" if ev.verified else "erase_failed"
    leases.note(conn, lease, provider_state=machine.provider_state)
    return None


def _evidence(lease: leases.Lease, ev: pr.EraseEvidence) -> dict[str, object]:
    return {
        "provider": lease.provider,
        "machine_id": ev.machine_id,
        "provider_state": ev.provider_state,
        "method": ev.method,
        "wipe_policy": lease.wipe_policy,
        "verified": ev.verified,
        **({"message": ev.message} if ev.message else {}),
    }


def _deploy_request(w: leases.Work, lease: leases.Lease) -> pr.DeployRequest:
    snap = w.snapshot
    image = snap.get("image") or {}
    ref = str(image.get("source_ref") or image.get("slug") or "") if isinstance(image, dict) else ""
    if not ref:
        raise PermanentError(
            f"allocation {w.allocation_id} has no baremetal image to deploy",
            code=reconciler_codes.BAREMETAL_DEPLOY_NO_IMAGE,
        )
    keys = tuple(str(k) for k in snap.get("ssh_keys") or ())
    hostname = f"{lease.allocation_id}"
    return pr.DeployRequest(lease.allocation_id, lease.machine_id, ref, keys, pr.cloud_init(keys, hostname), hostname)


def _owe_profile(conn: Connection, state: DesiredState, lease: leases.Lease) -> None:
    node = state.nodes.get(lease.node_name)
    if node is not None and node.slice_tagged:
        leases.owe_slice_profile(conn, lease.node_name, lease.allocation_id)


def _drift(conn: Connection, state: DesiredState, providers: Providers) -> None:
    """Deployed machines no unfinished lease of ours holds, and declared machines the provider lacks."""
    declared: dict[str, dict[str, str]] = {}
    for name, node in state.nodes.items():
        if node.machine is not None:
            declared.setdefault(node.machine.provider, {})[node.machine.machine_id] = name
    with dberrors.wrapped("read unfinished leases"):
        ours = {
            (str(p), str(m)): str(a)
            for p, m, a in conn.execute(
                "SELECT provider, machine_id, allocation_id FROM baremetal_leases WHERE phase <> 'erased'"
            ).fetchall()
        }
    for pname, machines in declared.items():
        try:
            provider = providers.get(pname)
            if provider is None:
                continue
            seen = {m.machine_id: m for m in provider.machines()}
        except GpuaasError:
            continue  # an unreachable provider says nothing about drift; its leases show why they wait
        found: list[tuple[str, str | None, str, str]] = []
        for mid, node_name in sorted(machines.items()):
            m = seen.get(mid)
            if m is None:
                found.append(
                    (mid, node_name, pr.MACHINE_MISSING, f"{pname} does not know machine {mid} (node {node_name})")
                )
            elif m.state in (pr.MachineState.DEPLOYING, pr.MachineState.DEPLOYED) and (pname, mid) not in ours:
                who = f" for {m.allocation_id}" if m.allocation_id else ""
                found.append(
                    (
                        mid,
                        node_name,
                        "baremetal.machine.unexpected_deploy",
                        f"{pname} reports machine {mid} (node {node_name}) {m.provider_state}{who}, "
                        "but no lease of ours deployed it: left alone",
                    )
                )
        leases.replace_drift(conn, pname, found)
