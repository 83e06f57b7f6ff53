"""Stopping a long-running loop on SIGTERM/SIGINT, for both agents.

A loop (the GitOps loop, the read API, the host agent) asks to be stopped
rather than interrupted: the signal sets an Event, the loop finishes the
pass in progress and returns. Before a command installs that, `gpuaas`
makes SIGTERM unwind like an exception (`Terminated`), so a stop during
start-up rolls back what was open.

Why the handler never touches the Event: a Python signal handler runs on
the main thread between two bytecodes, and that may be inside the very
`Event.wait()` the main thread is blocked in, while it holds the Event's
lock. `Event.set()` from there waits for a lock its own thread holds: the
process hangs for good (seen under SIGTERM at random moments). So the
handler only writes the signal's number to a pipe (`os.write` takes no
Python lock; a full pipe already holds a wake-up), and a small thread
reads the pipe, sets the Event and runs `on_first`, from outside the main
thread, where taking a lock (the Event's, a log handler's) is safe.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_DELIVERY_JOIN_S = 5.0  # on exit: let an `on_first` in progress finish (a log line, a shutdown request)


def _deliver(read_fd: int, stop: threading.Event, on_first: Callable[[signal.Signals], None] | None) -> None:
    """Off the main thread: each byte is one signal; set `stop`, and run `on_first` for the first."""
    while True:
        try:
            data = os.read(read_fd, 64)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for other platforms
            continue
        except OSError:
            return
        if not data:  # the write end closed: the block is over
            return
        for signum in data:
            first = not stop.is_set()
            stop.set()
            if first and on_first is not None:
                on_first(signal.Signals(signum))


@contextmanager
def stop_on(
    stop: threading.Event,
    *,
    signals: tuple[signal.Signals, ...] = STOP_SIGNALS,
    on_first: Callable[[signal.Signals], None] | None = None,
) -> Iterator[threading.Event]:
    """While inside, each of `signals` sets `stop`; `on_first` runs on the first one (a log line, a shutdown).

    `stop` is set and `on_first` runs on a helper thread, a moment after the
    signal (see the module docstring for why never in the handler). The
    previous handlers come back on exit. Off the main thread (a loop run by a
    test or an embedding program) Python allows no handler: nothing is
    installed and the caller stops the loop through `stop` itself.
    """
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum: int, _frame: FrameType | None) -> None:
        # No lock, no allocation worth naming: one byte. A full pipe (a signal storm) already
        # holds a wake-up; a closed one means the block is over and the old handler is back.
        with contextlib.suppress(OSError):
            os.write(write_fd, bytes((signum,)))

    courier = threading.Thread(target=_deliver, args=(read_fd, stop, on_first), name="gpuaas-signals", daemon=True)
    courier.start()
    previous: dict[signal.Signals, signal._HANDLER] = {}
    try:
        for s in signals:
            previous[s] = signal.signal(s, handler)
        yield stop
    finally:
        # Handlers first: Python looks a handler up when it runs it, so none of ours runs after this.
        for s, h in previous.items():
            signal.signal(s, h)
        os.close(write_fd)
        courier.join(timeout=_DELIVERY_JOIN_S)
        if not courier.is_alive():
            os.close(read_fd)  # else it is still in use: left to the process exit, never closed under a reader


class Terminated(BaseException):
    """SIGTERM arrived before the command installed its own handling (BaseException: no `except Exception` eats it)."""


def _raise_terminated(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises `Terminated` where the main thread is, unless someone already handles it."""
    installed = (
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL and threading.current_thread() is threading.main_thread()
    )
    if installed:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
