"""Parse many files at once in a pool of worker processes, stoppable at any time, never hanging.

Large sets of new files are parsed by a pool of workers (libyaml's composer
is the cost, and it holds the GIL); results come back in file order, so the
outcome is the one a single process gives. `cancel` is polled while waiting:
when it returns True, Cancelled is raised within a fraction of a second and
the workers are gone. A pool that breaks or stalls is stopped and what it
did not deliver is parsed in this process.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing as mp
import os
import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterator
from concurrent import futures
from multiprocessing import forkserver
from multiprocessing.process import BaseProcess

from desired import problems as p
from desired.reading import workervalues
from desired.reading.documents import Typed, parse_one
from desired.reading.packs import Codec, Encode, Encoded, Found, Packed
from desired.reading.safefiles import FileData

# Below this many files one process is faster than starting a pool.
PARALLEL_THRESHOLD = 2000
# No progress from the pool for this long: something is wrong with it; parse in this process instead.
WORKER_TIMEOUT_S = 60.0
_POLL_S = 0.25  # how often a wait for the pool looks at `cancel`

Cancel = Callable[[], bool]


class Cancelled(Exception):
    """The caller asked to stop (SIGTERM) while the tree was being parsed; nothing was produced."""


# Documents, file problems, the bytes zlib-compressed (see `loading._settle`).
_Result = tuple[list[Typed], list[p.Problem], bytes | None]
PACK_FILES = 512  # files per pack made in this process (a pool worker packs its chunk)


def parse_all(
    file_list: list[tuple[str, FileData]],
    workers: int | None,
    cancel: Cancel | None,
    *,
    pack: bool = False,
    values: bool = True,
    packs: list[Encoded] | None = None,
    codec: Codec | None = None,
) -> Generator[_Result, None, None]:
    """Each file's reader output, in order.

    With `pack`, pool workers also compress the bytes (see `loading._settle`).
    With `codec`, a pool's models cross the pipe inside packs it encodes
    (`_parse_chunk`); with `packs` too, the packs of these files are added to
    it (for a store to keep).
    """
    if packs is not None and codec is None:
        raise ValueError("packs are made with a codec")
    n = _pool_size(len(file_list), workers)
    if n <= 1:
        yield from _parse_here(file_list, values, packs, codec)
        return
    # forkserver, never fork: the caller may run threads (watchfiles' inotify thread, a
    # database pool), and a child forked while another thread holds a lock can wait on it
    # forever. The fork server is a clean single-threaded process that forks the workers.
    # ProcessPoolExecutor, not Pool: a worker that dies breaks the pool (BrokenProcessPool)
    # instead of being replaced behind our back while we wait.
    step = max(1, len(file_list) // (n * 32))
    done = 0
    pool = futures.ProcessPoolExecutor(n, mp_context=_CONTEXT)
    delivered = False
    try:
        # No list of the chunks: a chunk's bytes are let go once its result is taken.
        encode = codec.encode if codec is not None else None
        pending = collections.deque(
            pool.submit(_parse_chunk, file_list[i : i + step], pack, values, encode)
            for i in range(0, len(file_list), step)
        )
        while pending:
            # Taken off the queue: a future keeps its result, and every chunk's plain values held
            # until the last one arrived were a large part of the cold start's peak memory.
            fut = pending.popleft()
            waited = 0.0
            while True:
                if cancel is not None and cancel():
                    raise Cancelled
                try:
                    chunk = fut.result(timeout=_POLL_S)
                    break
                except futures.TimeoutError:
                    waited += _POLL_S
                    if waited >= WORKER_TIMEOUT_S:
                        raise _PoolStuck from None
            results = _unpacked(file_list[done : done + len(chunk[1])], chunk, packs, codec)
            done += len(results)
            yield from results
        delivered = True
    except (_PoolStuck, futures.process.BrokenProcessPool, OSError):
        # Degrade, never hang: the pool goes first (a hung worker must not outlive this
        # parse), then what it did not deliver is parsed here.
        _stop(pool, at_once=True)
        yield from _parse_here(file_list[done:], values, packs, codec)
    finally:
        # Also on Cancelled and on close() by the caller: queued chunks are dropped and
        # the workers are stopped, each wait bounded.
        _stop(pool, at_once=not delivered)


def _pool_size(files: int, workers: int | None) -> int:
    """How many workers parse `files` files (1: this process parses them)."""
    n = workers if workers is not None else (os.cpu_count() or 1)
    if n <= 1 or files < PARALLEL_THRESHOLD or "forkserver" not in mp.get_all_start_methods():
        return 1
    return n


def prestart(files: int, workers: int | None) -> None:
    """Start the fork server now when `files` files will go to a pool: a reader calls it before it reads them.

    The server's start (an interpreter, the parser's imports, the models' validators) then runs
    beside the reading instead of before the first worker; starting it is not waiting for it.
    """
    if _pool_size(files, workers) > 1:
        forkserver.ensure_running()


class _PoolStuck(Exception):
    pass


# An idle worker leaves on the shutdown sentinel in milliseconds; one that has not left by
# then is stuck (or busy on work nobody wants any more) and is terminated, then killed.
_LEAVE_S = 1.0
_TERM_S = 0.3


def _stop(pool: futures.ProcessPoolExecutor, *, at_once: bool) -> None:
    """Shut the pool down and reap its workers without ever waiting unbounded.

    `shutdown(wait=True)` joins every worker with no timeout, so one hung
    worker (blocked on a queue lock a dead sibling held, say) hangs the
    caller. Instead: ask the workers to leave, wait briefly (not at all when
    `at_once`), then SIGTERM, then SIGKILL whoever is still there. Killed
    workers make the pool's manager thread tear the queues down itself.
    Calling it again is a no-op.
    """
    # The executor keeps its workers private and offers no way to terminate them before
    # Python 3.14 (terminate_workers()); take them before shutdown() forgets them.
    workers: list[BaseProcess] = list((getattr(pool, "_processes", None) or {}).values())
    manager: threading.Thread | None = getattr(pool, "_executor_manager_thread", None)
    results = getattr(pool, "_result_queue", None)  # shutdown() drops its reference
    pool.shutdown(wait=False, cancel_futures=True)
    if not at_once:
        _join_all(workers, _LEAVE_S)
    for stop in (BaseProcess.terminate, BaseProcess.kill):
        alive = [w for w in workers if w.is_alive()]
        if not alive:
            break
        for w in alive:
            stop(w)
        _join_all(alive, _TERM_S if stop is BaseProcess.terminate else _LEAVE_S)
    if manager is None:
        return
    manager.join(_TERM_S if at_once else _LEAVE_S)  # it tears the queues down once the workers are gone
    if manager.is_alive():
        # A worker killed in the middle of sending a result leaves half a message in the pipe,
        # and the manager thread blocks reading the rest: for good, since this process holds
        # a write end too, and the interpreter's exit joins that thread (a test run that
        # finished and never exited). Every worker is gone by now, so nothing else writes:
        # with our write end closed it reads EOF, calls the pool broken and leaves.
        writer = getattr(results, "_writer", None)
        if writer is not None:
            with contextlib.suppress(OSError):
                writer.close()
        manager.join(_LEAVE_S)


def _join_all(workers: list[BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))


_CONTEXT = mp.get_context("forkserver") if "forkserver" in mp.get_all_start_methods() else mp.get_context()
if "forkserver" in mp.get_all_start_methods():
    # The fork server imports the parser once, and builds the models' validators (`desired.reading.warm`):
    # every worker it forks starts warm.
    _CONTEXT.set_forkserver_preload(["desired.reading.parsepool", "desired.reading.warm"])


# What a worker sends back for a chunk: its pack (None: not wanted) and its files as plain values
# (`workervalues`): a file whose documents are in the pack is sent as (None, None, bytes).
_Chunk = tuple[Encoded | None, list[workervalues.SentFile]]


def _parse_chunk(chunk: list[tuple[str, FileData]], pack: bool, values: bool, encode: Encode | None) -> _Chunk:
    # Typed here, beside the parse: the process that plans does not spend a second typing, and
    # validation happens once, here. What crosses the pipe is plain values (`workervalues`), never
    # pydantic's pickling of the models; with `encode`, the models cross inside the cache's pack
    # (encoded once, not twice). Compressing here keeps that off the parent too.
    sent: list[workervalues.SentFile] = []
    files: list[Packed] = []
    for name, data in chunk:
        typed, found = parse_one(name, data, values)
        packed = zlib.compress(data, 1) if pack and isinstance(data, bytes) else None
        if encode is not None and isinstance(data, bytes):
            files.append(_packed(data, typed, found))
            sent.append((None, None, packed))
        else:
            docs = tuple((t.index, t.line, t.value, t.model, workervalues.sent(t.problems)) for t in typed)
            sent.append((docs, workervalues.sent(found), packed))
    return (encode(files) if encode is not None else None), sent


def _unpacked(
    chunk_files: list[tuple[str, FileData]], chunk: _Chunk, packs: list[Encoded] | None, codec: Codec | None
) -> list[_Result]:
    """A worker's chunk as per-file results, the documents of packed files read from its pack."""
    encoded, sent = chunk
    entries = codec.decode(encoded.payload) if encoded is not None and codec is not None else None
    if encoded is not None:
        if entries is None:
            raise _PoolStuck  # our own worker's pack does not read back: parse here instead
        if packs is not None:
            packs.append(encoded)
    blobs = iter(encoded.blobs if encoded is not None else ())
    out: list[_Result] = []
    for (name, _data), (docs, found, packed) in zip(chunk_files, sent, strict=True):
        if docs is None or found is None:
            entry = entries[next(blobs)]  # type: ignore[index]  # packed files come with a pack
            typed = [
                Typed(index, line, None, model, dressed(problems, name)) for index, line, model, problems in entry.docs
            ]
            out.append((typed, dressed(entry.problems, name), packed))
            continue
        typed = [
            Typed(index, line, value, model, workervalues.received(problems, name) if problems else [])
            for index, line, value, model, problems in docs
        ]
        out.append((typed, workervalues.received(found, name) if found else [], packed))
    return out


def _parse_here(
    file_list: list[tuple[str, FileData]], values: bool, packs: list[Encoded] | None, codec: Codec | None
) -> Iterator[_Result]:
    """Parse in this process; with `packs`, add the packs of these files to it (made by `codec`)."""
    files: list[Packed] = []
    for name, data in file_list:
        typed, found = parse_one(name, data, values)
        if packs is not None and isinstance(data, bytes):
            files.append(_packed(data, typed, found))
            if len(files) >= PACK_FILES:
                packs.append(codec.encode(files))  # type: ignore[union-attr]  # packs come with a codec
                files = []
        yield typed, found, None
    if packs is not None and files:
        packs.append(codec.encode(files))  # type: ignore[union-attr]  # packs come with a codec


def _packed(data: bytes, typed: list[Typed], found: list[p.Problem]) -> Packed:
    """One file as the store's pack holds it."""
    return data, bare(found), tuple((t.index, t.line, t.model, bare(t.problems)) for t in typed)


def bare(problems: list[p.Problem]) -> tuple[Found, ...]:
    """Problems as the disk store keeps them: without the file (a blob may sit at any path)."""
    return tuple((x.code, x.message, x.line, x.column) for x in problems)


def dressed(found: tuple[Found, ...], name: str) -> list[p.Problem]:
    """The stored problems (`_bare`) of the file at `name`."""
    return [p.Problem(code, message, name, line, col) for code, message, line, col in found]
