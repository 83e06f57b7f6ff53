"""Fixtures for baremetal leases: the MAAS simulator, a real standalone Ironic, an SSH stand-in.

    node-00000 .. node-0000N   baremetal nodes, each mapped to machine bm-0000i of the provider
    alloc-0000000 ..           pending 8-GPU baremetal allocations with the catalog's baremetal image

The SSH stand-in is a TCP listener on 127.0.0.1 (a deployed machine's port 22 answering).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_tools.lab import ironic_service, maas_sim, sshstandin
from reconciler.store import connections
from reconciler.store.connections import Connection

MAAS_ENV = "GPUAAS_TEST_MAAS_KEY"


@pytest.fixture
def conn(db_url: str) -> Iterator[Connection]:
    c = connections.connect(db_url, autocommit=True)
    try:
        yield c
    finally:
        c.close()


Listener = sshstandin.SshStandIn  # something answering TCP on 127.0.0.1 (accepts and closes)


@pytest.fixture
def ssh() -> Iterator[Listener]:
    listener = Listener()
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
def maas() -> Iterator[maas_sim.MaasSimulator]:
    machines = {f"bm-{i:05d}": "127.0.0.1" for i in range(4)}
    with maas_sim.MaasSimulator(machines, deploy_s=0.05, erase_s=0.05) as sim:
        os.environ[MAAS_ENV] = maas_sim.API_KEY
        try:
            yield sim
        finally:
            os.environ.pop(MAAS_ENV, None)


def maas_provider(sim: maas_sim.MaasSimulator) -> dict[str, object]:
    return {"name": "maas-test", "kind": "maas", "url": sim.url, "credentials": {"env": MAAS_ENV}, "timeout_s": 5}


@pytest.fixture(scope="session")
def ironic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ironic_service.IronicService]:
    """One standalone Ironic per session with 8 fake-hardware machines available."""
    venv = ironic_service.venv()
    if venv is None:
        pytest.skip("Ironic is not installed (make deps puts it in .venv/ironic)")
    svc = ironic_service.IronicService(Path(tmp_path_factory.mktemp("ironic")), venv_dir=venv)
    svc.start()
    try:
        svc.enroll([f"bm-{i:05d}" for i in range(8)])
        yield svc
    finally:
        svc.stop()
