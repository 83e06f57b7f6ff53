"""A restarted `gpuaas serve` starts from its last computed status document (`keptcapacity`).

Computing the document takes tens of seconds at 10,000 nodes, and a
restarted service answered 503 until then. The kept document is served at
once, marked stale with its as_of, only while the inventory generation it was
computed at is current; it is exactly what was computed (served JSON equal),
and the fresh document replaces it as soon as it is computed.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.service import keptcapacity, statuscache
from reconciler.service.pool import Pool
from reconciler.store import connections


def _served(doc: Any) -> str:
    return json.dumps(doc, default=str, separators=(",", ":"))  # as server.json_response writes it


@pytest.fixture
def pool(fleet_url: str) -> Iterator[Pool]:
    p = Pool(fleet_url, size=4)  # two computations may wait on `_blocked` at once
    try:
        yield p
    finally:
        p.close()


def _cache(pool: Pool, url: str, kept: Path, *, wait_s: float) -> statuscache.Cache:
    cache = statuscache.Cache(pool, refresh_s=3600.0, wait_s=wait_s)
    cache.keep_in(url, kept)
    return cache


def _blocked(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """The next computations wait for the returned event: what a request sees meanwhile is deterministic."""
    go = threading.Event()
    compute = statuscache.status_document

    def slow(conn: Any, *, policy: str | None = None) -> dict[str, Any]:
        assert go.wait(60)
        return compute(conn, policy=policy)

    monkeypatch.setattr(statuscache, "status_document", slow)
    return go


def test_a_restart_serves_the_kept_document_until_the_fresh_one(
    fleet_url: str, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _cache(pool, fleet_url, tmp_path, wait_s=60.0)
    first.warm()
    computed = first.get().computed
    first.join(30)  # the document is kept after the waiters are answered

    go = _blocked(monkeypatch)
    unchanged = _cache(pool, fleet_url, tmp_path, wait_s=0.0)
    unchanged.warm()
    answer = unchanged.get()  # nothing committed since: the kept document is the current one
    assert not answer.stale
    assert _served(answer.computed.doc) == _served(computed.doc)

    with connections.connect(fleet_url, autocommit=True) as conn:  # any commit (claims, host reports)
        conn.execute("SELECT txid_current()")
    restarted = _cache(pool, fleet_url, tmp_path, wait_s=0.0)
    restarted.warm()
    answer = restarted.get()  # no 503: the kept document, while the fresh one is computed
    assert answer.stale
    assert answer.computed.as_of == computed.as_of
    assert _served(answer.computed.doc) == _served(computed.doc)  # exactly what was computed
    go.set()
    fresh = restarted.get(wait_s=60.0)
    assert not fresh.stale
    assert fresh.computed.as_of > computed.as_of
    assert _served(fresh.computed.doc) == _served(computed.doc)  # no inventory or claim changed: same answers
    restarted.join(30)
    unchanged.join(30)


def test_a_kept_document_of_another_inventory_generation_is_not_served(
    fleet_url: str, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _cache(pool, fleet_url, tmp_path, wait_s=60.0)
    first.warm()
    first.get()
    first.join(30)
    with connections.connect(fleet_url, autocommit=True) as conn:  # a sync of a new revision bumps it
        conn.execute("UPDATE inventory_generation SET generation = generation + 1")

    go = _blocked(monkeypatch)
    restarted = _cache(pool, fleet_url, tmp_path, wait_s=0.0)
    restarted.warm()
    with pytest.raises(statuscache.CapacityComputing):
        restarted.get()
    go.set()
    assert not restarted.get(wait_s=60.0).stale
    restarted.join(30)


def test_the_kept_form_gives_back_the_document_as_served(fleet_url: str) -> None:
    with connections.connect(fleet_url, autocommit=True) as conn:
        doc = statuscache.status_document(conn)
    back = keptcapacity.decode(keptcapacity.encode(doc))
    assert _served(back) == _served(doc)
    assert json.loads(_served(back)) == json.loads(_served(doc))


@pytest.mark.parametrize(
    "seconds",
    [
        1000.0,  # as a 10,000-node fleet's: the next computation cannot end within the wait
        0.01,  # a quick one: still not waited on after a restart, its time is another process's
    ],
)
def test_a_restart_after_a_commit_serves_the_kept_document_without_waiting(
    fleet_url: str, pool: Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seconds: float
) -> None:
    with connections.connect(fleet_url, autocommit=True) as conn:
        doc = statuscache.status_document(conn)
        ident = keptcapacity.identity(conn)
        old_key = statuscache.snapshot_key(conn)
        conn.execute("SELECT txid_current()")  # a commit since: the kept document is stale
    as_of = dt.datetime.now(dt.UTC)
    assert keptcapacity.save(
        tmp_path, fleet_url, None, ident=ident, snapshot=old_key, as_of=as_of, seconds=seconds, doc=doc
    )
    go = _blocked(monkeypatch)
    restarted = _cache(pool, fleet_url, tmp_path, wait_s=60.0)
    restarted.warm()
    t0 = time.monotonic()
    answer = restarted.get()
    assert time.monotonic() - t0 < 30  # not the 60 s wait
    assert answer.stale and answer.computed.kept
    assert answer.computed.as_of == as_of
    go.set()
    restarted.join(30)
    fresh = restarted.get()  # the fresh document replaced the kept one
    assert not fresh.stale and not fresh.computed.kept
