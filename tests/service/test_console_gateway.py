"""The console gateway's doors, with a real WebSocket client against uvicorn: who is refused, and that it is audited.

No guest here (the refusals never reach libvirt; an allowed attempt meets
libvirt's test driver, which has no console to open): the console itself is
tests/hostnet/test_console.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from reconciler.service import console
from reconciler.service.consolestreams import LibvirtConsoles
from reconciler.store import connections
from tests.service import consolelab as lab

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def base(db_url: str) -> Any:
    lab.active_allocation(db_url)
    with lab.gateway(db_url, LibvirtConsoles("test:///default")) as url:
        yield url


def _refused(url: str, headers: dict[str, str] | None = None) -> int:
    with pytest.raises(InvalidStatus) as e:
        connect(url, additional_headers=headers, open_timeout=10)
    return int(e.value.response.status_code)


@pytest.mark.parametrize(
    ("who", "headers", "reason"),
    [
        ("no credential", None, "no credential"),
        ("an unknown token", {"Authorization": "Bearer not-a-token"}, "unknown credential"),
        ("another tenant", {"Authorization": f"Bearer {lab.TOKENS['other']}"}, "not this tenant's allocation"),
    ],
)
def test_a_refused_attempt_is_403_and_audited(
    base: str, db_url: str, who: str, headers: dict[str, str] | None, reason: str
) -> None:
    assert _refused(lab.url(base), headers) == 403
    (row,) = lab.sessions(db_url)
    assert (row["allocation_id"], row["outcome"], row["reason"]) == (lab.ALLOC, "refused", reason)
    assert row["principal"] == {"another tenant": "mallory"}.get(who)
    assert row["closed_at"] is not None and row["remote"].startswith("127.0.0.1:")


def test_a_tenant_cannot_probe_for_allocation_ids(base: str, db_url: str) -> None:
    assert _refused(lab.url(base, "alloc-nope"), {"Authorization": f"Bearer {lab.TOKENS['tenant']}"}) == 403
    assert [(r["allocation_id"], r["outcome"]) for r in lab.sessions(db_url)] == [("alloc-nope", "refused")]


def test_a_token_in_the_subprotocol_works_for_browsers(base: str, db_url: str) -> None:
    """Allowed (its own allocation), so it reaches libvirt; the test driver has no console: 4500, audited."""
    with connect(
        lab.url(base),
        subprotocols=[console.SUBPROTOCOL, f"bearer.{lab.TOKENS['tenant']}"],  # type: ignore[list-item]
        open_timeout=10,
    ) as ws:
        assert ws.subprotocol == console.SUBPROTOCOL
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == console.CLOSE_FAILED
    (row,) = lab.sessions(db_url)
    assert (row["principal"], row["role"], row["outcome"]) == ("alice", "tenant", "failed")
    assert "console.unavailable" in row["reason"] and row["node"] == lab.NODE


def test_an_operator_on_a_released_allocation_is_told_why(base: str, db_url: str) -> None:
    with connections.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE allocations SET status = 'releasing' WHERE id = %s", (lab.ALLOC,))
    with (
        connect(
            lab.url(base), additional_headers={"Authorization": f"Bearer {lab.TOKENS['operator']}"}, open_timeout=10
        ) as ws,
        pytest.raises(ConnectionClosed) as closed,
    ):
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == console.CLOSE_REFUSED
    (row,) = lab.sessions(db_url)
    assert (row["principal"], row["role"], row["outcome"]) == ("oncall", "operator", "refused")
    assert row["reason"] == "allocation is releasing: no VM console to open"


def test_audit_rows_are_never_deleted(base: str, db_url: str) -> None:
    _refused(lab.url(base))
    import psycopg

    with connections.connect(db_url, autocommit=True) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("DELETE FROM console_sessions")
