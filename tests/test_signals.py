"""SIGTERM can never hang a long-running command (schemas/signals.py).

The handler used to call `Event.set()`; a signal landing while the main
thread was inside that Event's `wait()` (holding its lock) deadlocked the
process for good. 200 small processes, each spinning in the real
`stop_on` + `stop.wait()`, get one SIGTERM at a random moment; every one
must exit 0, each within 2 s of its signal (the launcher reaps them, see
tests/signal_storm.py; on the old handler about one in five hung).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from schemas import signals

STORM = Path(__file__).with_name("signal_storm.py")
BOUND_S = 2.0  # the bound, from the signal to the exit; a hung child shows as None


def test_sigterm_at_random_moments_never_hangs_a_stopping_process() -> None:
    done = subprocess.run(
        [sys.executable, str(STORM), "200", "25", "26"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        check=True,
    )
    results = json.loads(done.stdout)
    assert len(results) == 200
    hung = [r for r in results if r["code"] is None]
    assert not hung, f"{len(hung)} of 200 processes hung after SIGTERM"
    assert all(r["code"] == 0 for r in results), [r for r in results if r["code"] != 0]
    slow = [r for r in results if r["seconds"] > BOUND_S]
    assert not slow, f"exited later than {BOUND_S}s after SIGTERM: {slow}"


_HOLDING_THE_LOCK = """
import os, signal, threading
from schemas import signals
stop = threading.Event()
seen = []
with signals.stop_on(stop, on_first=seen.append):
    with stop._cond:  # what Event.wait() holds; the old handler blocked on it for good
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # bytecodes: the Python handler runs between them
            pass
    assert stop.wait(5)
assert seen == [signal.SIGTERM], seen
print("stopped")
"""


def test_a_signal_while_the_main_thread_holds_the_events_lock_still_stops() -> None:
    """In a child with a deadline: on the old handler this deadlocks (the test then fails, not hangs)."""
    done = subprocess.run(
        [sys.executable, "-c", _HOLDING_THE_LOCK],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    assert (done.returncode, done.stdout.strip()) == (0, "stopped"), done.stderr


def test_a_second_signal_runs_on_first_once_and_the_block_restores_handlers() -> None:
    stop = threading.Event()
    seen: list[signal.Signals] = []
    before = signal.getsignal(signal.SIGINT)
    with signals.stop_on(stop, on_first=seen.append):
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(5)
        os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before


def test_every_signal_handler_of_the_product_is_the_one_in_schemas_signals() -> None:
    """run, serve and host run stop through `signals.stop_on`; no other module installs a handler."""
    root = Path(__file__).parents[1]
    offenders = [
        str(p.relative_to(root))
        for package in ("reconciler", "host_reconciler", "desired", "policies", "tools/gpuaas_tools")
        for p in (root / package).rglob("*.py")
        if "signal.signal(" in p.read_text()
    ]
    assert offenders == []
    users = {
        p.parent.name + "/" + p.name
        for package in ("reconciler", "host_reconciler")
        for p in (root / package).rglob("*.py")
        if "stop_on(" in p.read_text()
    }
    assert {"commands/run.py", "commands/serve.py", "host_reconciler/command.py"} <= users
