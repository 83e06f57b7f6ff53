"""The cache store keeps each client's records in its own namespace and HMAC domain (`reconciler.caches.cachestore`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from reconciler.caches import blobpacks, cachestore

KEY = "ab" * 32


def _store(tmp_path: Path) -> cachestore.Store:
    store = cachestore.open_store(tmp_path / "cache", make=cachestore.Store, version=lambda: "v1", note=lambda _: None)
    assert store is not None
    return store


def test_a_record_and_a_file_of_the_same_key_are_apart(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put_record("results", KEY, b'{"plan": 1}')
    store.put_file("worlds", KEY, b"a kept world")
    assert store.get_record("results", KEY) == b'{"plan": 1}'
    assert store.get_file("worlds", KEY) == b"a kept world"


def test_a_payload_moved_to_another_namespace_fails_its_hmac(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.put_record("results", KEY, b"plain json")
    store.put_file("worlds", KEY, b"x" * 10)
    with sqlite3.connect(store.path) as db:
        (mac,) = db.execute("SELECT mac FROM results WHERE key = ?", (KEY,)).fetchone()
        db.execute("UPDATE worlds SET mac = ?, size = ?", (mac, len(b"plain json")))
    (tmp_path / "cache" / f"world-{KEY}").write_bytes(b"plain json")
    assert store.get_file("worlds", KEY) is None  # a result's MAC never vouches for a world
    assert store.rejected == 1


def test_an_unknown_namespace_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    with pytest.raises(ValueError, match="namespace"):
        store.put_record("packs", KEY, b"x")  # a client's own table, not a record namespace
    with pytest.raises(ValueError, match="namespace"):
        store.get_file("results", KEY)


def test_the_blob_packs_are_a_client_of_the_same_store(tmp_path: Path) -> None:
    store = blobpacks.open_store(tmp_path / "cache", note=lambda _: None)
    assert store is not None
    store.put_record("results", KEY, b"kept beside the packs")
    with sqlite3.connect(store.path) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"packs", "pack_entries", "results", "worlds", "capacity_documents"}
    assert store.get_record("results", KEY) == b"kept beside the packs"
