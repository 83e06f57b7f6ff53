"""systemd's notify protocol: READY=1 when serving, WATCHDOG=1 while alive, STOPPING=1 on the way out.

The units run `run`, `serve` and `host run` as `Type=notify` with
`WatchdogSec=`: systemd counts a service started only once it says READY=1
(so `After=` units and `systemctl start` wait for a loop that really runs),
and restarts one that stops sending WATCHDOG=1 (a hung process, not only a
dead one). The protocol is one datagram on the unix socket named by
$NOTIFY_SOCKET (`@name`: the abstract namespace); a few lines of stdlib, no
libsystemd. Outside systemd (no $NOTIFY_SOCKET) every call does nothing.

`alive` is what a watchdog ping vouches for: by default that the process
still schedules threads; `serve` passes a probe of its own /healthz, so a
server that stopped answering is restarted too.

Lives in `schemas` because the host agent uses it and must not import `reconciler`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("gpuaas.notify")


def _address() -> str | None:
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or addr[0] not in "/@":
        return None
    return "\0" + addr[1:] if addr[0] == "@" else addr


def notify(*states: str) -> bool:
    """Send `KEY=value` lines to systemd; False when not run under a notify socket or it cannot be reached."""
    addr = _address()
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall("\n".join(states).encode())
    except OSError as e:  # a supervisor gone away must not take the service down
        log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), e)
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between pings: half of $WATCHDOG_USEC (systemd's advice), for this process only; None when off."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2_000_000, 0.05)
    except ValueError:
        return None


@contextmanager
def serving(status: str = "", alive: Callable[[], bool] | None = None) -> Iterator[None]:
    """READY=1 now, WATCHDOG=1 every half watchdog period while `alive()`, STOPPING=1 when the block ends."""
    notify("READY=1", *([f"STATUS={status}"] if status else []))
    every = watchdog_interval()
    stop = threading.Event()
    thread = None
    if every is not None:
        thread = threading.Thread(target=_ping, args=(stop, every, alive), name="gpuaas-watchdog", daemon=True)
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        notify("STOPPING=1")


def _ping(stop: threading.Event, every: float, alive: Callable[[], bool] | None) -> None:
    while not stop.wait(every):
        try:
            ok = alive() if alive is not None else True
        except Exception as e:  # a failing probe means "not alive", never a dead watchdog thread
            log.warning("watchdog probe failed: %s", e)
            ok = False
        if ok:
            notify("WATCHDOG=1")
