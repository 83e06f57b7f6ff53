"""`--watch` for read commands (`status`, `get`): print again whenever the answer changes.

kubectl's habit: the first answer at once, then each changed one, until
Ctrl-C (which ends the watch with status 0, as kubectl does). Text is
reprinted whole under a timestamped rule; `-o json` prints one compact
document per line (a script reads it line by line), `-o yaml` one `---`
document per change. An unchanged answer prints nothing, so a watch left
running on a quiet fleet stays quiet.
"""

from __future__ import annotations

import argparse
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from schemas import output, signals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-w", "--watch", action="store_true", help="print again whenever the answer changes (Ctrl-C ends)")
    p.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="with --watch: how often to read (default 2)"
    )


def show(args: argparse.Namespace, read: Callable[[], Any], render: Callable[[Any], str]) -> int:
    """Print `read()` once, or with `--watch` each time it changes."""
    if not getattr(args, "watch", False):
        _print(args.output, read(), render, watching=False)
        return 0
    # Ctrl-C asks the watch to stop instead of raising inside a database read: a KeyboardInterrupt
    # in the middle of a query makes psycopg cancel it over a second connection, which can stall
    # on a busy server. The read in progress finishes, then the watch ends with status 0.
    last: Any = None
    with signals.stop_on(threading.Event()) as stop:
        while not stop.is_set():
            doc = read()
            if doc != last:
                _print(args.output, doc, render, watching=True)
                last = doc
            stop.wait(max(0.1, args.interval))
    return 0


def _print(fmt: str, doc: Any, render: Callable[[Any], str], *, watching: bool) -> None:
    if output.structured(fmt):
        if watching:
            output.emit(doc, fmt, indent=None if fmt == "json" else 2, stream=True)
        else:
            output.emit(doc, fmt)
        return
    if watching:
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        print(f"--- {now}")
    print(render(doc), flush=True)
