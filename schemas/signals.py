"""Stopping a long-running loop on SIGTERM/SIGINT, for both agents.

A loop (the GitOps loop, the read API, the host agent) asks to be stopped
rather than interrupted: the signal sets an Event, the loop finishes the
pass in progress and returns. Before a command installs that, `gpuaas`
makes SIGTERM unwind like an exception (`Terminated`), so a stop during
start-up rolls back what was open.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_on(stop: threading.Event, *, signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
            on_first: Callable[[signal.Signals], None] | None = None) -> Iterator[threading.Event]:
    """While inside, each of `signals` sets `stop`; `on_first` runs on the first one (a log line, a shutdown).

    The previous handlers come back on exit. Off the main thread (a loop run
    by a test or an embedding program) Python allows no handler: nothing is
    installed and the caller stops the loop through `stop` itself.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        first = not stop.is_set()
        stop.set()
        if first and on_first is not None:
            on_first(signal.Signals(signum))

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class Terminated(BaseException):
    """SIGTERM arrived before the command installed its own handling (BaseException: no `except Exception` eats it)."""


def _raise_terminated(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` where the main thread is, unless someone already handles it."""
    installed = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and \
        threading.current_thread() is threading.main_thread()
    if installed:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
