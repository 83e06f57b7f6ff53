"""Progress of long work on stderr: phases with counts and rates.

A cold apply of 10,000 nodes runs for minutes; `fleet synth`, `plan`,
`validate` of a large tree and image pulls run long too. Silence reads as a
hang, so each of them reports its phases here:

- on a terminal, one line drawn as each phase starts and redrawn in place
  (`plan: write host plans 4,210/10,000 (1,380/s) 3.1 s`), and a line left
  behind for each phase that took a second or more;
- not on a terminal (CI logs, journald), a plain line every
  $GPUAAS_PROGRESS_INTERVAL seconds (default 10) while a phase runs, and one
  when a phase that was reported ends, so short runs stay silent;
- `--log-format json`: the same periodic records as JSON lines
  (`{"event": "progress", "phase": ..., "done": ..., "total": ..., "rate": ...}`).

Always on stderr: stdout keeps the command's own output (`-o json`). A
background thread redraws, so a phase without counts still shows its
elapsed time. Lives in `schemas` because the host agent's image pulls use it
too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TextIO, TypeVar

T = TypeVar("T")
ENV_INTERVAL = "GPUAAS_PROGRESS_INTERVAL"
STYLES = ("auto", "tty", "plain", "json", "off")
_TTY_REDRAW = 0.1  # seconds between redraws on a terminal
_TTY_KEEP = 1.0  # a phase this long leaves its line behind on a terminal


@dataclass
class Phase:
    """One step of long work: a name, an optional total, a count that `advance` moves."""

    name: str
    total: int | None = None
    done: int = 0
    started: float = 0.0
    reported: bool = False  # a plain or JSON line went out for it
    unit: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def advance(self, n: int = 1) -> None:
        self.done += n


def _count(n: int) -> str:
    return f"{n:,}"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f}"


class Progress:
    """Reports the phases of one command on `stream` (default stderr)."""

    def __init__(
        self, stream: TextIO | None = None, *, style: str = "auto", interval: float | None = None, title: str = ""
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if style == "auto":
            isatty = getattr(self.stream, "isatty", None)
            style = "tty" if isatty is not None and isatty() else "plain"
        self.style = style
        self.interval = interval if interval is not None else float(os.environ.get(ENV_INTERVAL) or 10.0)
        self.title = title
        self._lock = threading.Lock()
        self._current: Phase | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False

    # --------------------------------------------------------------- the API commands use

    @contextmanager
    def phase(self, name: str, total: int | None = None, *, unit: str = "") -> Iterator[Phase]:
        """Report `name` while the block runs; advance the yielded Phase as items are done."""
        ph = Phase(name, total, started=time.monotonic(), unit=unit)
        with self._lock:
            outer, self._current = self._current, ph
            if self.style == "tty":
                # Drawn once as it starts: a phase shorter than a redraw tick would otherwise never show.
                self._draw(ph)
        self._start_thread()
        try:
            yield ph
        finally:
            with self._lock:
                self._current = outer  # a nested phase hands the line back to the one around it
                self._finish(ph)

    def iterate(self, name: str, items: Iterable[T], total: int | None = None, *, unit: str = "") -> Iterator[T]:
        """`items`, counted as a phase."""
        with self.phase(name, total, unit=unit) as ph:
            for item in items:
                yield item
                ph.advance()

    def close(self) -> None:
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with self._lock:
            self._clear()

    def __enter__(self) -> Progress:
        _ACTIVE.append(self)  # the loader and the planner report their phases to the command's display
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- drawing

    def _start_thread(self) -> None:
        if self.style == "off" or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._tick, name="gpuaas-progress", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        wait = _TTY_REDRAW if self.style == "tty" else max(self.interval, 0.05)  # never a busy loop
        while not self._stop.wait(wait):
            with self._lock:
                ph = self._current
                if ph is None:
                    continue
                if self.style == "tty":
                    self._draw(ph)
                elif time.monotonic() - ph.started >= self.interval:
                    self._line(ph, final=False)

    def line_text(self, ph: Phase, *, final: bool) -> str:
        took = time.monotonic() - ph.started
        label = f"{self.title}: {ph.name}" if self.title else ph.name
        size = _mib if ph.unit == "bytes" else _count
        unit = " MiB" if ph.unit == "bytes" else f" {ph.unit}" if ph.unit else ""
        count = ""
        if ph.total is not None:
            count = f" {size(ph.done)}/{size(ph.total)}{unit}"
        elif ph.done:
            count = f" {size(ph.done)}{unit}"
        rate = ""
        if ph.done and took > 0:
            per_s = round(ph.done / took)
            rate = f" ({_mib(per_s)} MiB/s)" if ph.unit == "bytes" else f" ({_count(per_s)}/s)"
        return f"{label}{count}{rate} {'in ' if final else ''}{took:.1f} s" + (" done" if final else "")

    def _draw(self, ph: Phase) -> None:
        self.stream.write("\r\x1b[K" + self.line_text(ph, final=False))
        self.stream.flush()
        self._drawn = True

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False

    def _line(self, ph: Phase, *, final: bool) -> None:
        ph.reported = True
        if self.style == "json":
            took = time.monotonic() - ph.started
            doc = {
                "event": "progress",
                "phase": ph.name,
                "done": ph.done,
                "total": ph.total,
                "rate": round(ph.done / took, 1) if took > 0 else None,
                "seconds": round(took, 2),
                "final": final,
            }
            if self.title:
                doc["command"] = self.title
            self.stream.write(json.dumps(doc) + "\n")
        else:
            self.stream.write(self.line_text(ph, final=final) + "\n")
        self.stream.flush()

    def _finish(self, ph: Phase) -> None:
        if self.style == "tty":
            self._clear()
            if time.monotonic() - ph.started >= _TTY_KEEP:
                self.stream.write(self.line_text(ph, final=True) + "\n")
                self.stream.flush()
        elif self.style in ("plain", "json") and ph.reported:
            self._line(ph, final=True)


def add_argument(parser: argparse.ArgumentParser) -> None:
    """`--progress` on a long-running command."""
    parser.add_argument(
        "--progress",
        choices=STYLES,
        default="auto",
        help="progress on stderr: auto (a live line on a terminal, periodic lines otherwise), "
        "tty, plain, json (JSON lines; also with $GPUAAS_LOG_FORMAT=json) or off",
    )


def for_args(args: argparse.Namespace, title: str = "") -> Progress:
    """The Progress a command's arguments ask for (`--progress`, `--log-format`, $GPUAAS_LOG_FORMAT)."""
    style = getattr(args, "progress", "auto") or "auto"
    if style == "auto" and (getattr(args, "log_format", None) or os.environ.get("GPUAAS_LOG_FORMAT")) == "json":
        style = "json"
    return Progress(style=style, title=title)


_ACTIVE: list[Progress] = []  # the commands' displays, innermost last
_OFF = Progress(style="off")


def active() -> Progress:
    """The display of the command running now, or one that shows nothing.

    Library code deep in a command (desired/ reading and parsing, the
    cross-file rules, the planner) reports its phases here without being
    handed the display. Callers advance their Phase in batches (every few
    hundred items), never per item, so the hot path pays nothing measurable.
    """
    return _ACTIVE[-1] if _ACTIVE else _OFF
