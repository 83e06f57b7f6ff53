"""The portal's side: tenant tokens, and request intake committing to a real bare git remote.

Real parts: PostgreSQL (the applied example fleet), a bare git remote and
clones of it, `gpuaas serve` on 127.0.0.1 with real HTTP clients (httpx).
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler import cli
from reconciler.service import tenants
from reconciler.store import connections
from tests.service.conftest import EXAMPLE, Served, serve

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGkq1pXK4n0mR2o1x0dYt1cJ3Yb0vW2e9o8G1q3hZpXa portal@test"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    """A bare remote holding examples/fleet on main."""
    seed = tmp_path / "seed"
    shutil.copytree(EXAMPLE, seed)
    _git(seed, "init", "-q", "-b", "main")
    _git(seed, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    _git(seed, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "fleet")
    bare = tmp_path / "remote.git"
    _git(tmp_path, "clone", "-q", "--bare", str(seed), str(bare))
    return bare


def _clone(remote: Path, where: Path) -> Path:
    _git(where.parent, "clone", "-q", str(remote), str(where))
    return where


@pytest.fixture
def tokens(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    path = tmp_path / "tenant-tokens"
    return path, {t: tenants.issue(path, t) for t in ("globex", "initech")}


@pytest.fixture
def portal(fleet_url: str, remote: Path, tmp_path: Path, tokens: tuple[Path, dict[str, str]]) -> Iterator[Served]:
    token_file = tmp_path / "operator-token"
    token_file.write_text("operator-secret\n")
    token_file.chmod(0o600)
    checkout = _clone(remote, tmp_path / "intake")
    yield from serve(
        fleet_url,
        token="operator-secret",  # noqa: S106
        tenant_tokens=tokens[0],
        intake_repo=checkout,
        intake_push=("origin", "main"),
    )


def _body(**over: Any) -> dict[str, Any]:
    return {
        "tenant": "globex",
        "sku": "h200-sxm-slice",
        "region": "us-east-1",
        "gpu_count": 1,
        "image": "h200-ubuntu-24.04-gpuaas-slice",
        "ssh_keys": [KEY],
        "lease_hours": 24,
        **over,
    }


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


OP = _auth("operator-secret")


def test_tenant_token_sees_only_its_tenant(portal: Served, tokens: tuple[Path, dict[str, str]]) -> None:
    acme = _auth(tokens[1]["initech"])
    with httpx.Client(base_url=portal.url, timeout=60) as c:
        assert c.get("/api/v1/allocations/alloc-0002", headers=OP).json()["tenant"] == "globex"
        other = c.get("/api/v1/allocations/alloc-0002", headers=acme)
        absent = c.get("/api/v1/allocations/no-such-0001", headers=acme)
        assert other.status_code == absent.status_code == 404
        assert other.json()["error"]["code"] == "api.not_found"
        assert c.get("/api/v1/allocations/alloc-0002/telemetry", headers=acme).status_code == 404
        mine = c.get("/api/v1/allocations", headers=acme).json()
        assert mine["items"] and {a["tenant"] for a in mine["items"]} == {"initech"}
        assert c.get("/api/v1/allocations?tenant=globex", headers=acme).json()["items"] == []
        assert c.get("/api/v1/nodes", headers=acme).json()["error"]["code"] == "api.forbidden"
        assert c.get("/", headers=acme).status_code == 403
        assert c.get("/api/v1/allocations", headers=_auth("wrong")).status_code == 401
        # a tenant cannot release or request for another tenant
        assert c.delete("/api/v1/allocations/alloc-0002", headers=acme).status_code == 404
        r = c.post("/api/v1/allocations", headers=acme, json=_body(tenant="globex"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "intake.tenant_mismatch"
        # revoked through the command: refused at once, no restart; the other tenant's token still works
        assert cli.main(["tenant", "token", "revoke", "initech", "--file", str(tokens[0])]) == 0
        assert c.get("/api/v1/allocations", headers=acme).status_code == 401
        assert c.get("/api/v1/allocations", headers=_auth(tokens[1]["globex"])).status_code == 200


def test_intake_commits_pushes_replays_and_releases(
    portal: Served, remote: Path, fleet_url: str, tokens: tuple[Path, dict[str, str]]
) -> None:
    globex = _auth(tokens[1]["globex"])
    with httpx.Client(base_url=portal.url, timeout=60) as c:
        body = _body(tenant=None, id="portal-0001")
        r = c.post("/api/v1/allocations", headers={**globex, "Idempotency-Key": "k1"}, json=body)
        assert r.status_code == 202, r.text
        doc = r.json()
        assert doc["id"] == "portal-0001" and doc["tenant"] == "globex" and doc["pushed_to"] == "origin/main"
        assert _git(remote, "rev-parse", "main") == doc["commit"]
        text = _git(remote, "show", "main:allocations/portal-0001.yaml")
        assert "lease_hours: 24" in text and "tenant: globex" in text
        again = c.post("/api/v1/allocations", headers={**globex, "Idempotency-Key": "k1"}, json=body)
        assert again.status_code == 202 and again.json() == doc and again.headers["idempotent-replayed"] == "true"
        assert _git(remote, "rev-parse", "main") == doc["commit"]  # no second commit
        reused = c.post("/api/v1/allocations", headers={**globex, "Idempotency-Key": "k1"}, json=_body(gpu_count=2))
        assert reused.status_code == 422 and reused.json()["error"]["code"] == "intake.idempotency_key_reused"
        dup = c.post("/api/v1/allocations", headers=globex, json=body)
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "intake.exists"
        gone = c.delete("/api/v1/allocations/portal-0001", headers=globex)
        assert gone.status_code == 202 and gone.json()["state"] == "released"
        assert "state: released" in _git(remote, "show", "main:allocations/portal-0001.yaml")
        twice = c.delete("/api/v1/allocations/portal-0001", headers=globex)
        assert twice.status_code == 409 and twice.json()["error"]["code"] == "intake.already_released"
        metrics = c.get("/metrics", headers=OP).text
        for status, n in (("202", 3), ("409", 2), ("422", 1)):  # every answer, a replay too
            assert f'gpuaas_portal_intakes_total{{status="{status}"}} {n}.0' in metrics
    with connections.connect(fleet_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT principal, action, status, code, commit_sha FROM portal_audit ORDER BY id"
        ).fetchall()
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("tenant:globex", "create", 202),
        ("tenant:globex", "create", 409),
        ("tenant:globex", "release", 202),
        ("tenant:globex", "release", 409),
    ]
    assert rows[0][4] == doc["commit"] and rows[1][3] == "intake.exists"


def test_422_carries_validates_codes_and_messages(
    portal: Served, remote: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = _body(id="portal-bad1", gpu_count=9, image="no-such-image", ssh_keys=["not a key"])
    with httpx.Client(base_url=portal.url, timeout=60) as c:
        r = c.post("/api/v1/allocations", headers=OP, json=body)
    assert r.status_code == 422, r.text
    got = [(p["code"], p["message"]) for p in r.json()["error"]["problems"]]
    # the same file, written by hand into a checkout, as `gpuaas validate` sees it
    from reconciler.reconcile import requests

    check = _clone(remote, tmp_path / "check")
    (check / "allocations" / "portal-bad1.yaml").write_bytes(
        requests.render_request(
            allocation_id="portal-bad1",
            tenant="globex",
            sku=body["sku"],
            gpus=9,
            region=body["region"],
            image="no-such-image",
            ssh_keys=["not a key"],
            requested_at=__import__("datetime").datetime.now(__import__("datetime").UTC),
            lease_hours=24,
        )
    )
    capsys.readouterr()
    assert cli.main(["validate", str(check), "-o", "json"]) == 1
    want = [(p["code"], p["message"]) for p in json.loads(capsys.readouterr().out)["errors"]]
    assert got == want and len(got) >= 2
    assert _git(remote, "rev-list", "--count", "main") == "1"  # nothing was committed


def test_concurrent_intakes_on_two_replicas_lose_no_commit(fleet_url: str, remote: Path, tmp_path: Path) -> None:
    n = 20
    with ExitStack() as stack:
        replicas = [
            stack.enter_context(_serving(fleet_url, _clone(remote, tmp_path / f"replica{i}"))) for i in range(2)
        ]

        def one(i: int) -> httpx.Response:
            with httpx.Client(base_url=replicas[i % 2].url, timeout=120) as c:
                return c.post(
                    "/api/v1/allocations",
                    json=_body(id=f"burst-{i:04d}", tenant="hooli"),
                    headers={"Idempotency-Key": f"burst-{i}"},
                )

        with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
            answers = list(pool.map(one, range(n)))
    assert [a.status_code for a in answers] == [202] * n, [a.text for a in answers if a.status_code != 202]
    commits = {a.json()["commit"] for a in answers}
    log = _git(remote, "log", "--format=%H", "main").split()
    assert commits <= set(log) and len(log) == n + 1
    files = _git(remote, "ls-tree", "--name-only", "main", "allocations/").split()
    assert {f"allocations/burst-{i:04d}.yaml" for i in range(n)} <= set(files)
    # and the reconciler takes every one: placed, or pending with a reason
    assert cli.main(["apply", str(_clone(remote, tmp_path / "applied")), "--db-url", fleet_url]) == 0
    with connections.connect(fleet_url, autocommit=True) as conn:
        rows = conn.execute("SELECT status, pending_code FROM allocations WHERE id LIKE 'burst-%%'").fetchall()
    assert len(rows) == n and all(status != "pending" or code for status, code in rows), rows


def _serving(url: str, checkout: Path) -> Any:
    from contextlib import contextmanager

    return contextmanager(serve)(url, intake_repo=checkout, intake_push=("origin", "main"))


def test_catalog_prices_and_images(served: Served) -> None:
    with httpx.Client(base_url=served.url, timeout=60) as c:
        skus = {s["sku"]: s for s in c.get("/api/v1/skus").json()["items"]}
        slice_ = skus["h200-sxm-slice"]
        price = slice_["price"]["gpu_hourly_minor"]
        assert price > 0 and slice_["gpu_counts"]
        assert slice_["price"]["hourly_minor_by_gpu_count"] == {str(n): n * price for n in slice_["gpu_counts"]}
        metal = skus["h200-sxm-baremetal-8g"]
        metal_images = {i["slug"] for i in c.get("/api/v1/images?sku=h200-sxm-baremetal-8g").json()["items"]}
        slice_images = {i["slug"] for i in c.get("/api/v1/images?sku=h200-sxm-slice").json()["items"]}
        assert slice_["default_image"] in slice_images and metal["default_image"] in metal_images
        assert not metal_images & slice_images  # a slice image never offered for bare metal
        assert c.get("/api/v1/images?sku=nope").status_code == 404
        for offer in c.get("/api/v1/capacity").json()["capacity"]:
            unit = skus[offer["sku"]]["price"]["gpu_hourly_minor"]
            assert offer["price"]["gpu_hourly_minor"] == unit
            assert all(s["hourly_price_minor"] == s["gpu_count"] * unit for s in offer["sizes"])


def _events(response: httpx.Response, want: int) -> list[dict[str, Any]]:
    """Read `want` events off an open SSE response (the read timeout bounds a stream that stalls)."""
    out: list[dict[str, Any]] = []
    current: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(("id:", "event:", "data:")):
            name, _, value = line.partition(":")
            current[name] = value.strip()
        elif line == "" and "data" in current:
            doc = json.loads(current["data"])
            assert str(doc["outbox_id"]) == current["id"] and doc["event_type"] == current["event"]
            out.append(doc)
            current = {}
            if len(out) == want:
                return out
    return out


def test_event_stream_resumes_from_last_event_id(
    portal: Served, remote: Path, tmp_path: Path, fleet_url: str, tokens: tuple[Path, dict[str, str]]
) -> None:
    globex = _auth(tokens[1]["globex"])
    with connections.connect(fleet_url, autocommit=True) as conn:
        start = conn.execute("SELECT coalesce(max(id), 0) FROM outbox").fetchone()[0]
    with httpx.Client(base_url=portal.url, timeout=httpx.Timeout(60, read=60)) as c:
        with c.stream("GET", "/api/v1/events", headers=globex) as first:
            assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
            for i in range(3):
                assert c.post("/api/v1/allocations", headers=globex, json=_body(id=f"sse-{i:04d}")).status_code == 202
            assert (
                c.post("/api/v1/allocations", headers=OP, json=_body(id="sse-other", tenant="hooli")).status_code == 202
            )
            applied = _clone(remote, tmp_path / "applied")
            assert cli.main(["apply", str(applied), "--db-url", fleet_url]) == 0
            got = _events(first, 1)  # then the client goes away mid-stream
        assert got[0]["allocation_id"].startswith("sse-0") and got[0]["state"] == "reserved"
        with c.stream("GET", "/api/v1/events", headers={**globex, "Last-Event-ID": str(got[0]["outbox_id"])}) as again:
            got += _events(again, 2)
    with connections.connect(fleet_url, autocommit=True) as conn:
        want = [
            r[0]
            for r in conn.execute(
                "SELECT o.id FROM outbox o JOIN allocations a ON a.id = o.aggregate_id"
                " WHERE o.id > %s AND a.tenant = 'globex' ORDER BY o.id",
                (start,),
            ).fetchall()
        ]
        other = conn.execute("SELECT count(*) FROM outbox WHERE aggregate_id = 'sse-other'").fetchone()[0]
    assert [e["outbox_id"] for e in got] == want and len(want) == 3  # each once, in order, none missed
    assert {e["tenant"] for e in got} == {"globex"} and other == 1  # hooli's event was not in globex's stream


def test_webhooks_are_signed_retried_and_dead_lettered(fleet_url: str, remote: Path, tmp_path: Path) -> None:
    import hashlib
    import hmac
    import http.server
    import threading
    import time

    secret = b"webhook-secret-0123456789"
    (tmp_path / "secret").write_bytes(secret)
    (tmp_path / "secret").chmod(0o600)
    got: list[tuple[dict[str, str], bytes]] = []
    tries: dict[str, int] = {}

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            doc = json.loads(body)
            tries[doc["allocation_id"]] = tries.get(doc["allocation_id"], 0) + 1
            ok = doc["allocation_id"] != "wh-dead" and tries[doc["allocation_id"]] > 2  # two failures, then fine
            if ok:
                got.append((dict(self.headers), body))
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_a: Any) -> None:
            pass

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        with contextmanager_serve(
            fleet_url,
            intake_repo=_clone(remote, tmp_path / "intake"),
            intake_push=("origin", "main"),
            webhook_url=f"http://127.0.0.1:{receiver.server_port}/hook",
            webhook_secret=tmp_path / "secret",
            webhook_backoff_s=0.01,
        ) as served:
            with httpx.Client(base_url=served.url, timeout=60) as c:
                for aid in ("wh-0001", "wh-dead"):
                    assert c.post("/api/v1/allocations", json=_body(id=aid)).status_code == 202
            assert cli.main(["apply", str(_clone(remote, tmp_path / "applied")), "--db-url", fleet_url]) == 0
            until = time.monotonic() + 120
            dead: list[Any] = []
            while time.monotonic() < until and not (got and dead):
                time.sleep(0.1)
                with connections.connect(fleet_url, autocommit=True) as conn:
                    dead = conn.execute(
                        "SELECT payload, attempts, last_status FROM portal_webhook_dead_letters"
                    ).fetchall()
    finally:
        receiver.shutdown()
        receiver.server_close()
    headers, body = got[0]
    assert json.loads(body)["allocation_id"] == "wh-0001" and tries["wh-0001"] == 3
    stamp, mac = (part.split("=", 1)[1] for part in headers["X-Gpuaas-Signature"].split(","))
    assert hmac.compare_digest(mac, hmac.new(secret, f"{stamp}.".encode() + body, hashlib.sha256).hexdigest())
    assert headers["X-Gpuaas-Event-Id"] == str(json.loads(body)["outbox_id"])
    assert len(dead) == 1 and dead[0][0]["allocation_id"] == "wh-dead" and dead[0][1:] == (8, 503)


def contextmanager_serve(url: str, **settings: Any) -> Any:
    from contextlib import contextmanager

    return contextmanager(serve)(url, **settings)


def test_request_create_takes_vm_profile_and_lease_hours(
    remote: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkout = _clone(remote, tmp_path / "bot")
    key = tmp_path / "id.pub"
    key.write_text(KEY + "\n")
    argv = [
        "request",
        "create",
        "--repo",
        str(checkout),
        "--tenant",
        "globex",
        "--sku",
        "h200-sxm-slice",
        "--gpus",
        "1",
        "--region",
        "us-east-1",
        "--ssh-key",
        str(key),
        "--vm-profile",
        "h200_1g_24c_64g",
        "--lease-hours",
        "48",
        "-o",
        "json",
    ]
    assert cli.main([*argv, "--id", "bot-0001"]) == 0
    text = (checkout / "allocations" / "bot-0001.yaml").read_text()
    assert "vm_profile: h200_1g_24c_64g" in text and "lease_hours: 48" in text
    capsys.readouterr()
    bad = [a if a != "h200_1g_24c_64g" else "no-such-profile" for a in argv]
    assert cli.main([*bad, "--id", "bot-0002"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "request.invalid"
    assert not (checkout / "allocations" / "bot-0002.yaml").exists()
