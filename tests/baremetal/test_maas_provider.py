"""The MAAS provider against recorded responses of the real API and the simulator, over real HTTP.

- OAuth1 as MAAS signs it: PLAINTEXT, signature '&' + token secret, nonce and timestamp;
- each recorded machine state maps to the lease's vocabulary, the owner stamp and address read back;
- a wrong key is refused (401 -> ProviderRefused), a down MAAS is unreachable, and neither message nor
  repr carries the key.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuaas_tools.lab.maas_sim import API_KEY, MaasSimulator
from reconciler.providers import protocols as pr
from reconciler.providers.maas import MaasProvider, oauth_header

RECORDED = Path(__file__).parent / "recorded"


def test_oauth_header_is_plaintext_signed_with_the_token_secret() -> None:
    header = oauth_header("ck:tk:s3cr3t")
    fields = dict(
        (k, urllib.parse.unquote(v))
        for k, v in (part.strip().split("=", 1) for part in header.removeprefix("OAuth ").split(","))
    )
    fields = {k: v.strip('"') for k, v in fields.items()}
    assert fields["oauth_signature_method"] == "PLAINTEXT" and fields["oauth_signature"] == "&s3cr3t"
    assert fields["oauth_consumer_key"] == "ck" and fields["oauth_token"] == "tk"  # noqa: S105 - a test key
    assert fields["oauth_nonce"] and fields["oauth_timestamp"].isdigit()
    with pytest.raises(pr.PermanentError) as e:
        oauth_header("not-a-key")
    assert e.value.code == pr.CREDENTIALS and "not-a-key" not in e.value.message


class _Recorded(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture
def recorded() -> Iterator[tuple[str, type[_Recorded]]]:
    class Handler(_Recorded):
        pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/MAAS", Handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("name", "state", "owner"),
    [
        ("machine_deploying.json", pr.MachineState.DEPLOYING, "alloc-0004"),
        ("machine_deployed.json", pr.MachineState.DEPLOYED, "alloc-0004"),
        ("machine_failed_deployment.json", pr.MachineState.DEPLOY_FAILED, "alloc-0004"),
        ("machine_disk_erasing.json", pr.MachineState.RELEASING, None),
        ("machine_failed_disk_erasing.json", pr.MachineState.ERASE_FAILED, None),
        ("machine_ready.json", pr.MachineState.READY, None),
    ],
)
def test_recorded_machine_states_map_to_the_lease(
    recorded: tuple[str, type[_Recorded]], name: str, state: pr.MachineState, owner: str | None
) -> None:
    url, handler = recorded
    handler.body = (RECORDED / name).read_bytes()
    m = MaasProvider("maas-rec", url, api_key="a:b:c").machine("4y3h8a")
    assert (m.state, m.allocation_id, m.addresses) == (state, owner, ("10.20.0.41",))
    assert m.provider_state == json.loads(handler.body)["status_name"]


def test_a_wrong_key_is_refused_and_no_message_carries_a_key() -> None:
    with MaasSimulator({"m1": "127.0.0.1"}) as sim:
        wrong = MaasProvider("maas-sim", sim.url, api_key="simconsumer:simtoken:wrong-secret")
        with pytest.raises(pr.ProviderRefused) as e:
            wrong.machine("m1")
        assert "401" in e.value.message and "wrong-secret" not in e.value.message
        assert "wrong-secret" not in repr(wrong)
        right = MaasProvider("maas-sim", sim.url, api_key=API_KEY)
        sim.down = True
        with pytest.raises(pr.ProviderUnreachable) as u:
            right.machine("m1")
        assert "simsecret" not in u.value.message
        sim.down = False
        assert right.machine("m1").state is pr.MachineState.READY
        assert right.machine("nope").state is pr.MachineState.MISSING


def test_deploy_and_release_speak_the_documented_operations() -> None:
    with MaasSimulator({"m1": "127.0.0.1"}, deploy_s=0, erase_s=0) as sim:
        maas = MaasProvider("maas-sim", sim.url, api_key=API_KEY)
        keys = ("ssh-ed25519 AAAAkey tenant@laptop",)
        m = maas.deploy(
            pr.DeployRequest("alloc-1", "m1", "ubuntu/noble", keys, pr.cloud_init(keys, "alloc-1"), "alloc-1")
        )
        assert m.allocation_id == "alloc-1" and sim.machines["m1"].distro == "noble"
        assert "ssh_authorized_keys" in sim.machines["m1"].user_data and keys[0] in sim.machines["m1"].user_data
        assert maas.machine("m1").state is pr.MachineState.DEPLOYED
        maas.release(pr.ReleaseRequest("alloc-1", "m1", "secure_erase"))
        assert sim.machines["m1"].erase == "secure_erase"
        ready = maas.machine("m1")
        ready = maas.machine("m1") if ready.state is not pr.MachineState.READY else ready
        assert ready.state is pr.MachineState.READY and ready.allocation_id is None
        assert maas.erase_evidence(ready, pr.ReleaseRequest("alloc-1", "m1", "secure_erase")).verified
