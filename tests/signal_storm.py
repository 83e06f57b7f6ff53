"""Launcher for tests/test_signals.py: SIGTERM at random moments to many small processes.

Run as `python tests/signal_storm.py COUNT BATCH SEED`. It imports the real
`schemas.signals` once, then forks COUNT children (BATCH at a time, so the
machine is not flooded). Each child installs `signals.stop_on` and spins in
`stop.wait(0)` / `stop.wait(short)`: the main thread is inside the Event's
`wait()` (holding its lock) most of the time, which is where a handler that
calls `Event.set()` deadlocks. The launcher sends each child one SIGTERM
after a random delay, reaps it, and prints one JSON line: per child the
seconds from the signal to its exit and its exit status (None: it hung and
was killed after the deadline). Forking keeps 200 processes cheap: no
interpreter start-up per child.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time

HANG_S = 10.0  # a child still alive this long after its signal is hung (the test's bound is lower)


def _child(ready_fd: int, spin: int) -> None:
    from schemas import signals

    stop = threading.Event()
    with signals.stop_on(stop, on_first=lambda _sig: None):
        os.write(ready_fd, b"r")
        os.close(ready_fd)
        timeout = (0.0, 0.0001, 0.001)[spin % 3]
        while not stop.wait(timeout):
            pass
    os._exit(0)


def main(count: int, batch: int, seed: int) -> None:
    import schemas.signals  # noqa: F401 - imported once here, before any fork

    rng = random.Random(seed)  # noqa: S311 - random moments, not secrets
    results: list[dict[str, object]] = []
    for start in range(0, count, batch):
        kids: dict[int, float] = {}
        for i in range(start, min(count, start + batch)):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                try:
                    _child(w, i)
                finally:
                    os._exit(70)
            os.close(w)
            os.read(r, 1)  # installed and spinning
            os.close(r)
            kids[pid] = 0.0
        for pid in kids:
            time.sleep(rng.random() * 0.01)
            os.kill(pid, signal.SIGTERM)
            kids[pid] = time.monotonic()
        while kids:
            now = time.monotonic()
            for pid, sent in list(kids.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    results.append({"pid": pid, "seconds": now - sent, "code": os.waitstatus_to_exitcode(status)})
                    del kids[pid]
                elif now - sent > HANG_S:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    results.append({"pid": pid, "seconds": now - sent, "code": None})
                    del kids[pid]
            time.sleep(0.005)
    print(json.dumps(results))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
