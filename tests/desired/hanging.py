"""A file whose bytes hang the pool worker that receives them (tests/desired/test_parallel_parse.py).

It lives in its own importable module because the worker, forked by the
fork server, must find `hang` by name when it unpickles the file.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

HANG_S = 30.0  # long enough to fail a bounded-wait assertion, short enough that a broken pool still ends


def hang(pid_file: str) -> bytes:
    # A worker stuck for good, as one blocked on a queue lock a dead sibling held: it
    # ignores SIGTERM too, so only SIGKILL ends it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(HANG_S)
    return b""


class HangsInWorker(bytes):
    """Valid YAML in this process; unpickled in a worker, it never arrives."""

    pid_file: str

    def __new__(cls, data: bytes, pid_file: Path) -> HangsInWorker:
        self = super().__new__(cls, data)
        self.pid_file = str(pid_file)
        return self

    def __reduce_ex__(self, protocol: object) -> tuple[object, tuple[str]]:
        return hang, (self.pid_file,)
