"""The service's read pool while the database is down: the first request waits the pool's whole wait,
the next ones only `down_wait_s`, so a probe or a scrape gets its 503 or `gpuaas_database_up 0` in time."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from reconciler.service.pool import Pool, session_kwargs
from schemas import dberrors


def test_after_a_failed_wait_the_next_waits_are_short(tmp_path: Path) -> None:
    pool = Pool(f"postgresql://postgres@/nothing?host={tmp_path}&port=5432", wait_timeout_s=120.0, down_wait_s=0.2)
    try:
        assert not pool.down
        with pytest.raises(dberrors.DatabaseUnavailable), pool.reading(wait_s=0.2):
            pass
        assert pool.down
        t0 = time.monotonic()
        for _ in range(3):
            with pytest.raises(dberrors.DatabaseUnavailable), pool.reading():
                pass
        assert time.monotonic() - t0 < 60  # the pool's own wait is 120 s each; a loaded machine takes ~1 s
        assert pool.down
    finally:
        pool.close()


def test_a_connection_handed_out_again_ends_the_short_waits(fleet_url: str) -> None:
    pool = Pool(fleet_url, size=1, wait_timeout_s=30.0, down_wait_s=0.2)
    try:
        with pool.reading() as held:  # the only connection: the next wait cannot be served
            with pytest.raises(dberrors.DatabaseUnavailable), pool.reading(wait_s=0.2):
                pass
            assert pool.down
            assert held.execute("SELECT 1").fetchone() == (1,)
        with pool.reading() as conn:  # waits at most 0.2 s; the connection is free now
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert not pool.down
    finally:
        pool.close()


def test_the_service_sessions_run_without_jit(fleet_url: str) -> None:
    """The read pool's sessions (and every other service session built from `session_kwargs`) have JIT off:
    PostgreSQL compiled the dashboard's fleet-wide aggregates on every request (0.3 s at 10,000 nodes),
    and keep the read-only default and the statement timeout beside it."""
    pool = Pool(fleet_url, size=1, statement_timeout_ms=12_345)
    try:
        with pool.reading() as conn:
            assert conn.execute("SHOW jit").fetchone() == ("off",)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("12345ms",)
            assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
    finally:
        pool.close()
    kwargs = session_kwargs(
        fleet_url, read_only=False, statement_timeout_ms=1000, connect_timeout=5, application_name="gpuaas-test"
    )
    with psycopg.connect(fleet_url, **kwargs) as conn:
        assert conn.execute("SHOW jit").fetchone() == ("off",)
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("off",)
