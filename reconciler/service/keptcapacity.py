"""The last computed status document, kept on disk so a restarted service serves capacity at once.

Computing the document reads and validates the whole inventory and runs the
planner's engine: tens of seconds at 10,000 nodes, and a restarted service
answered 503 (`api.capacity_computing`) until then. Each computed document
is kept in the cache store (`reconciler.caches.cachestore`, namespace
`capacity_documents`: HMAC-signed under this user's key, a file per database and
policy) with the database's identity and the inventory generation it was
read at. At start the service loads it only when that generation is still
the store's: nodes, slots and SKUs are then the ones it describes, and only
claims and states may have moved since, as they do between two refreshes of
a running service. It is served marked stale, with its `as_of`, until the
fresh document (computed at once) replaces it. A document of another
generation or database is never served.

On disk, not in the database: the service's connections are read-only, and
a write there would change the snapshot the cache is keyed by (a computed
document would always look stale). JSON with datetimes tagged, no pickle.
A failed save or load costs the fast restart, never a request.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import zlib
from pathlib import Path
from typing import Any

from reconciler.caches import cachestore
from reconciler.store import views
from reconciler.store.connections import Connection

log = logging.getLogger(__name__)

NAMESPACE = "capacity_documents"
FORMAT = 1
_TAG = "$datetime"


def _encode(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return {_TAG: value.isoformat()}
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot keep a {type(value).__name__} in a capacity document")


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and _TAG in obj:
        return dt.datetime.fromisoformat(obj[_TAG])
    return obj


def encode(doc: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(doc, default=_encode, separators=(",", ":")).encode(), 1)


def decode(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(zlib.decompress(data), object_hook=_decode)
    return out


def identity(conn: Connection) -> tuple[int, int]:
    """(the database's oid, the inventory generation): a kept document is served only while both hold."""
    row = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    return (int(row[0]) if row else 0), views.inventory_generation(conn)


def _key(url: str, policy: str | None) -> str:
    return hashlib.sha256(f"{FORMAT}\0{url}\0{policy or ''}".encode()).hexdigest()


def _open(directory: Path | None) -> cachestore.Store | None:
    return cachestore.open_store(directory, make=cachestore.Store, version=lambda: str(FORMAT), note=log.warning)


def save(
    directory: Path | None,
    url: str,
    policy: str | None,
    *,
    ident: tuple[int, int],
    snapshot: str,
    as_of: dt.datetime,
    seconds: float,
    doc: dict[str, Any],
) -> bool:
    """Keep `doc` as this database's and policy's last document; False when it could not be."""
    try:
        store = _open(directory)
        if store is None:
            return False
        try:
            record = {"ident": list(ident), "snapshot": snapshot, "as_of": as_of, "seconds": seconds, "doc": doc}
            store.put_file(NAMESPACE, _key(url, policy), encode(record))
        finally:
            store.close()
        return True
    except Exception as e:  # keeping it is an optimisation: a failure must not fail the computation
        log.warning("could not keep the capacity document: %r", e)
        return False


def load(
    directory: Path | None, url: str, policy: str | None, conn: Connection
) -> tuple[str, dict[str, Any], dt.datetime, float] | None:
    """(snapshot, doc, as_of, seconds) of the kept document when it is this database's at its current
    inventory generation, else None."""
    try:
        store = _open(directory)
        if store is None:
            return None
        try:
            data = store.get_file(NAMESPACE, _key(url, policy))
        finally:
            store.close()
        if data is None:
            return None
        record = decode(data)
        if tuple(record["ident"]) != identity(conn):
            return None
        return str(record["snapshot"]), record["doc"], record["as_of"], float(record["seconds"])
    except Exception as e:  # a damaged or foreign record: compute as before
        log.warning("could not load the kept capacity document: %r", e)
        return None
