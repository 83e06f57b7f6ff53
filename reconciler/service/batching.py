"""Batching concurrent lookups: many requests for keys answered by one call in a worker thread."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from anyio import to_thread

V = TypeVar("V")


class Batcher(Generic[V]):
    """Keys asked for by concurrent requests, answered by one call in a worker thread (one query for many).

    While one batch is in the database the next one gathers, so a single
    request waits one round trip and ten thousand reconnecting agents cost a
    few dozen queries, not ten thousand. A key missing from the answer gets None.
    """

    def __init__(self, fetch: Callable[[list[str]], Mapping[str, Any]], max_batch: int = 1000) -> None:
        self._fetch = fetch
        self._max = max_batch
        self._pending: dict[str, list[asyncio.Future[Any]]] = {}
        self._running = False

    async def get(self, key: str) -> V:
        fut: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(key, []).append(fut)
        if not self._running:
            self._running = True
            asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                keys = list(itertools.islice(self._pending, self._max))
                waiting = {k: self._pending.pop(k) for k in keys}
                try:
                    answers = await to_thread.run_sync(self._fetch, keys)
                except Exception as e:  # every waiter gets the error it would have had alone
                    for futs in waiting.values():
                        for f in futs:
                            if not f.done():
                                f.set_exception(e)
                    continue
                for k, futs in waiting.items():
                    for f in futs:
                        if not f.done():
                            f.set_result(answers.get(k))
        finally:
            self._running = False
