"""Ending a command that holds a whole tree without freeing it object by object.

A PR plan or a validation of a 10,000-node tree ends holding millions of
small objects (models, node facts, index entries). At interpreter exit they
are freed one by one, a large share of the command's wall time spent after
the answer was printed (`gpuaas bench prplan` times the whole process). Such
a command arms
`skip_teardown()`; the console script then flushes what was written and
shuts logging down, and leaves with `os._exit`.

Armed in the console script, it also freezes the heap (`gc.freeze`): the
collector's first pass after loading would walk every object made while it
was paused, and find nothing to free.

Only the console script ends this way (`cli.entry`): `cli.main()`, which
tests call in-process, returns as before and freezes nothing. Commands that
own servers, temporary files or child processes never arm it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from typing import NoReturn

_armed = False
_script = False  # set by the console script (`script`), never by an in-process caller of cli.main()


def script() -> None:
    """This process is the console script: it ends when the command returns."""
    global _script  # noqa: PLW0603 - one process-wide switch
    _script = True


_held: list[object] = []


def hold(*objects: object) -> None:
    """Keep `objects` until the console script ends (a kept PR base: freeing its half a million
    objects when the function that read it returns would be a tenth of the plan). In-process
    callers (tests) hold nothing: their objects are freed as usual."""
    if _script:
        _held.extend(objects)


def skip_teardown() -> None:
    """Say that this process holds nothing that must be freed or finalized at exit, only memory.

    Call it while the collector is still paused after building the heap
    (`loading.collector_paused`), so that no collection walks it first.
    """
    global _armed  # noqa: PLW0603 - one process-wide switch
    _armed = True
    if _script:
        gc.freeze()


def finish(status: int) -> NoReturn:
    """Exit with `status`; without teardown when a command armed it.

    Under a profiler or a tracer (cProfile, coverage) the exit is the normal
    one: they write what they gathered at interpreter exit.
    """
    if not _armed or sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A reader that left, or a closed stream: nothing more to keep.
        with contextlib.suppress(BrokenPipeError, ValueError):
            stream.flush()
    os._exit(status)
