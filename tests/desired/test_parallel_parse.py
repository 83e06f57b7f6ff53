"""Parsing large trees in a pool: same result as one process, never a hang, stoppable at once (issue 18)."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import pytest

from desired.problems import Severity
from desired.reading import loading, parsepool
from desired.state import LoadResult
from reconciler.caches import blobpacks
from reconciler.caches.blobs import BlobCache
from tests.desired import hanging

FILES = parsepool.PARALLEL_THRESHOLD + 400
TEMPLATE = (Path(__file__).resolve().parents[2] / "examples/fleet/images/ubuntu-24.04-gpuaas-slice.yaml").read_text()


def _tree(n: int = FILES) -> list[tuple[str, bytes]]:
    files = []
    for i in range(n):
        body = TEMPLATE.replace("ubuntu-24.04-gpuaas-slice", f"img-{i:05d}", 1)
        if i % 997 == 0:  # a broken file here and there: problems must come back in order, too
            body = "apiVersion: gpuaas.io/v1alpha1\nkind: Image\nslug: [\n"
        files.append((f"images/img-{i:05d}.yaml", body.encode()))
    assert TEMPLATE.count("ubuntu-24.04-gpuaas-slice") >= 1
    return files


def _summary(result: LoadResult) -> tuple[list[str], list[str]]:
    return sorted(result.state.images), [p.render() for p in result.problems if p.severity is Severity.ERROR]


def test_the_pool_gives_what_one_process_gives() -> None:
    files = _tree()
    parallel = loading.parse_files(files, workers=2)
    serial = loading.parse_files(files, workers=1)
    assert _summary(parallel) == _summary(serial)
    assert len(parallel.state.images) == FILES - len(range(0, FILES, 997))


def test_the_pool_never_forks_the_calling_process() -> None:
    # A fork of a process with threads (watchfiles, a DB pool) can wait forever on a lock
    # some other thread held at the fork: the workers come from a clean fork server.
    assert parsepool._CONTEXT.get_start_method() == "forkserver"


def test_cancel_stops_a_parallel_parse_within_a_second_and_reaps_the_workers() -> None:
    files = _tree(parsepool.PARALLEL_THRESHOLD * 6)
    busy = threading.Event()  # a thread is running in this process, as in the watch loop
    t = threading.Thread(target=busy.wait, daemon=True)
    t.start()
    asked: list[float] = []

    def cancel() -> bool:
        if not asked:
            asked.append(time.monotonic() + 0.5)
        return time.monotonic() >= asked[0]

    with pytest.raises(loading.Cancelled):
        loading.parse_files(files, workers=2, cancel=cancel)
    took = time.monotonic() - asked[0]
    busy.set()
    assert took < 3.0, took  # the whole parse takes 5 s and more at load 10 on 2 cores: stopped, not finished
    assert mp.active_children() == []  # the workers are gone, not left running


def test_a_stuck_pool_falls_back_to_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsepool, "WORKER_TIMEOUT_S", 0.0)  # any wait at all counts as stuck
    files = _tree()
    result = loading.parse_files(files, workers=2)
    assert _summary(result) == _summary(loading.parse_files(files, workers=1))


def _with_a_hung_worker(tmp_path: Path) -> tuple[list[tuple[str, bytes]], Path]:
    files = _tree()
    pid_file = tmp_path / "hung.pid"
    name, data = files[len(files) // 2]
    files[len(files) // 2] = (name, hanging.HangsInWorker(data, pid_file))
    return files, pid_file


def _assert_gone(pid_file: Path) -> None:
    # The hung worker really ran (and ignored SIGTERM), and is now killed and reaped:
    # no process, not even a zombie, and nothing the pool still counts as a child.
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists(), pid
    assert mp.active_children() == []


def test_a_hung_worker_is_killed_and_its_files_parsed_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsepool, "WORKER_TIMEOUT_S", 1.0)
    files, pid_file = _with_a_hung_worker(tmp_path)
    started = time.monotonic()
    result = loading.parse_files(files, workers=2)
    took = time.monotonic() - started
    assert took < hanging.HANG_S / 3, took  # bounded: never waits the worker out
    assert _summary(result) == _summary(loading.parse_files([(n, bytes(d)) for n, d in files], workers=1))
    _assert_gone(pid_file)
    _assert_no_manager_left()


def test_cancel_with_a_hung_worker_stops_within_a_second(tmp_path: Path) -> None:
    files, pid_file = _with_a_hung_worker(tmp_path)
    asked: list[float] = []

    def cancel() -> bool:
        # Ask only once the hung worker holds its chunk, so the stop has to deal with it.
        if not asked and pid_file.exists():
            asked.append(time.monotonic())
        return bool(asked)

    with pytest.raises(loading.Cancelled):
        loading.parse_files(files, workers=2, cancel=cancel)
    took = time.monotonic() - asked[0]
    assert took < hanging.HANG_S / 3, took  # never waits the hung worker out (loose for load 10 on 2 cores)
    _assert_gone(pid_file)
    _assert_no_manager_left()


def _assert_no_manager_left() -> None:
    """No pool manager thread outlives the parse: the interpreter's exit would join it (and may wait forever)."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread" and t.is_alive()]
        if not left:
            return
        time.sleep(0.05)
    raise AssertionError(f"pool manager thread(s) still running: {left}")


def test_a_long_lived_tree_keeps_packed_bytes_and_locates_exactly_as_with_raw_bytes() -> None:
    files = _tree()
    # A duplicate slug: reported while the state is assembled, so located from the packed bytes.
    files.append(("images/zz-dup.yaml", b"# moved down a line\n" + files[1][1]))
    packed = loading.parse_files(files, workers=2, cache=BlobCache(keep_values=False))
    raw = loading.parse_files(files, workers=1)
    assert _summary(packed) == _summary(raw)
    assert any(p.file == "images/zz-dup.yaml" and (p.line, p.column) == (5, 7) for p in packed.problems)
    for name in ("img-00001", f"img-{FILES - 1:05d}"):
        source, plain = packed.state.source("Image", name), raw.state.source("Image", name)
        assert source.doc.packed and source.doc.value is None
        assert len(source.doc.data) < len(plain.doc.data)
        for path in (("slug",), ("source_ref",), ("compatible_skus", 0)):
            assert source.at(*path, code="x", message="m") == plain.at(*path, code="x", message="m")


def test_the_pool_hands_models_over_in_the_store_packs_and_they_read_back(tmp_path: Path) -> None:
    """With a disk store, a worker's models cross the pipe inside its pack: the same result, and a full store."""

    files = _tree()
    store = blobpacks.open_store(tmp_path / "cache")
    assert store is not None
    parallel = loading.parse_files(files, workers=2, cache=BlobCache(store))
    serial = loading.parse_files(files, workers=1)
    assert _summary(parallel) == _summary(serial)
    assert [p.render() for p in parallel.problems] == [p.render() for p in serial.problems]
    assert parallel.state.images == serial.state.images
    ids = {blobpacks.git_blob_id(data) for _name, data in files}
    back = store.get_many(sorted(ids))
    assert set(back) == ids and store.rejected == 0
    by_slug = {e.docs[0][2].slug: e.docs[0][2] for e in back.values() if e.docs and e.docs[0][2] is not None}
    assert by_slug == serial.state.images


def test_a_models_only_cache_takes_the_pool_s_models_in_packs_and_no_plain_values() -> None:
    """`--no-cache` commands read models alone: the same result, no plain value carried or kept."""
    files = _tree()
    parallel = loading.parse_files(files, workers=2, cache=BlobCache(models_only=True))
    serial = loading.parse_files(files, workers=1)
    assert [p.render() for p in parallel.problems] == [p.render() for p in serial.problems]
    assert parallel.state.images == serial.state.images
    sources = list(parallel.state.sources.values())
    assert sources and all(s.doc.value is None for s in sources)


def test_the_fork_server_is_started_before_the_files_are_read_only_for_a_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []
    monkeypatch.setattr(parsepool.forkserver, "ensure_running", lambda: started.append(1))
    parsepool.prestart(parsepool.PARALLEL_THRESHOLD - 1, 2)  # one process parses these
    parsepool.prestart(parsepool.PARALLEL_THRESHOLD, 1)
    assert started == []
    parsepool.prestart(parsepool.PARALLEL_THRESHOLD, 2)
    assert started == [1]
