"""The cache store keeps each client's records in its own namespace and HMAC domain (`reconciler.caches.cachestore`)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from reconciler.caches import blobpacks, cachefiles, cachestore

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


def test_a_file_signed_in_part_vouches_for_its_head_and_checks_the_rest_when_read(tmp_path: Path) -> None:
    """`put_file(signed=n)`: the HMAC covers n bytes; the client checks the rest by digests those bytes hold."""
    store = _store(tmp_path)
    rest = b"a file of the world"
    head = b"index:" + hashlib.sha256(rest).digest()
    store.put_file("worlds", KEY, head + rest, signed=len(head))
    assert store.get_file("worlds", KEY) is None  # never read whole: its HMAC covers only the head
    part = store.get_file_part("worlds", KEY)
    assert part is not None and part.head == head and part.size == len(head + rest)
    assert part.read_checked(len(head), len(rest), head[6:]) == rest
    with pytest.raises(cachefiles.Damaged):
        part.read_checked(len(head), len(rest), hashlib.sha256(b"other").digest())
    part.close()
    assert store.get_file_part("worlds", KEY) is None  # found damaged: the record was removed
    assert not (tmp_path / "cache" / f"world-{KEY}").exists()
    store.put_file("worlds", KEY, head + rest, signed=len(head))
    world = tmp_path / "cache" / f"world-{KEY}"
    world.write_bytes(b"X" + (head + rest)[1:])  # the signed head changed: a miss
    assert store.get_file_part("worlds", KEY) is None
    store.put_file("worlds", KEY, head + rest)  # signed whole: read with get_file only
    assert store.get_file_part("worlds", KEY) is None and store.get_file("worlds", KEY) == head + rest
    with pytest.raises(ValueError, match="signed length"):
        store.put_file("worlds", KEY, head, signed=len(head) + 1)
