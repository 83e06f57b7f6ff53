"""A git revision's blobs are read with one `git cat-file --batch`, not a round trip per blob.

Only the blobs the caches lack are fetched; an oversized blob is still read
cut off and refused by size; any doubt about the batch output (a missing
object, a wrong header, bytes too many or too few, git failing) falls back to
the per-blob read, so the LoadResult is the same as reading blob by blob.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import git
import pytest

from desired.reading import gitobjects, gitrepo, loading, safefiles, yamlio
from desired.state import LoadResult
from reconciler.caches.blobs import BlobCache

pytestmark = pytest.mark.integration  # real git repositories and subprocesses

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
ALLOC = (EXAMPLE / "allocations" / "alloc-0001.yaml").read_text()
MISSING = "0" * 40


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The example fleet plus 20 allocations and two files with the same bytes, committed."""
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    for n in range(100, 120):
        (root / "allocations" / f"alloc-{n:04d}.yaml").write_text(ALLOC.replace("alloc-0001", f"alloc-{n:04d}"))
    for name in ("a.yaml", "b.yaml"):
        (root / "notes").mkdir(exist_ok=True)
        (root / "notes" / name).write_text("# the same bytes in two files: one blob\n")
    _commit(root, "base")
    return root


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Blob ids read one by one (the per-blob fallback), in order; every read batches from 1 blob up."""
    seen: list[str] = []
    plain = gitrepo._blob_reader

    def counting(repo: git.Repo, sha: str) -> Callable[[], safefiles.FileData]:
        read = plain(repo, sha)

        def counted() -> safefiles.FileData:
            seen.append(sha)
            return read()

        return counted

    monkeypatch.setattr(gitrepo, "_blob_reader", counting)
    monkeypatch.setattr(gitrepo, "BATCH_MIN", 1)
    return seen


def _commit(root: Path, message: str) -> None:
    repo = git.Repo.init(root)
    with repo:
        repo.git.add("-A")
        repo.index.commit(message, author=git.Actor("t", "t@example.com"))


def _one_by_one(root: Path, rev: str, monkeypatch: pytest.MonkeyPatch) -> LoadResult:
    with monkeypatch.context() as m:
        m.setattr(gitrepo, "BATCH_MIN", 10**9)
        return gitrepo.read_revision(root, rev)


def _calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(mode, number of ids) of every cat-file process started by the batch reader."""
    calls: list[tuple[str, int]] = []
    plain = gitrepo._cat_file

    def counting(repo: git.Repo, mode: str, keys: Sequence[str]) -> bytes | None:
        calls.append((mode, len(keys)))
        return plain(repo, mode, keys)

    monkeypatch.setattr(gitrepo, "_cat_file", counting)
    return calls


def test_a_revision_is_read_in_one_batch_with_the_same_result(
    tree: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _calls(monkeypatch)
    batched = gitrepo.read_revision(tree, "HEAD")
    assert reads == []  # not one blob read on its own
    files = len(list(tree.rglob("*.yaml")))
    # Two processes for the whole tree; the two files with the same bytes are asked for once.
    assert calls == [("--batch-check", files - 1), ("--batch", files - 1)]
    assert batched.state.file_count == files
    assert batched == _one_by_one(tree, "HEAD", monkeypatch)


def test_batched_bytes_are_the_blobs_bytes(tree: Path, reads: list[str]) -> None:
    refs = gitrepo.revision_refs(tree, "HEAD")
    files = loading._read_files(refs, list(range(len(refs))), None)
    assert reads == []
    assert [name for name, _ in files] == [ref.name for ref in refs]
    for (name, data), ref in zip(files, refs, strict=True):
        assert data == (tree / name).read_bytes()
        assert isinstance(data, bytes) and safefiles.blob_id(data) == ref.key


def test_only_blobs_missing_from_the_cache_are_fetched(
    tree: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = BlobCache()
    gitrepo.read_revision(tree, "HEAD", cache=cache)
    gitrepo.release(cache)
    for n in (100, 101, 102):
        path = tree / "allocations" / f"alloc-{n:04d}.yaml"
        path.write_text(path.read_text().replace("gpu_count: 1", "gpu_count: 2"))
    _commit(tree, "three changed")
    calls = _calls(monkeypatch)
    refs = gitrepo.revision_refs(tree, "HEAD")
    result = loading.assemble(loading.blobs_for(refs, cache=cache))
    assert calls == [("--batch-check", 3), ("--batch", 3)]
    assert reads == []
    assert result == _one_by_one(tree, "HEAD", monkeypatch)


@pytest.mark.parametrize("way", ["git", "files"])
def test_a_read_by_delta_batches_its_changed_blobs(
    tree: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch, way: str
) -> None:
    """Through GitPython: one batch for the changed blobs. From the repository's files (`gitobjects`,
    the usual way): each changed blob read from the object store, no git process at all."""
    if way == "git":
        monkeypatch.setattr(gitobjects, "open_repo", lambda root: None)
    cache = BlobCache()
    try:
        gitrepo.read_revision(tree, "HEAD", cache=cache)
        for n in range(200, 205):
            (tree / "allocations" / f"alloc-{n:04d}.yaml").write_text(ALLOC.replace("alloc-0001", f"alloc-{n:04d}"))
        _commit(tree, "five more")
        calls = _calls(monkeypatch)
        by_delta = gitrepo.read_revision(tree, "HEAD", cache=cache)
        assert cache.last_full == ""  # it was read by delta
    finally:
        gitrepo.release(cache)
    if way == "git":
        assert calls == [("--batch-check", 5), ("--batch", 5)]
        assert reads == []
    else:
        assert calls == []
        added = {ref.key for ref in gitrepo.revision_refs(tree, "HEAD") if ref.name.startswith("allocations/alloc-020")}
        assert len(reads) == 5 and set(reads) == added
    assert by_delta == _one_by_one(tree, "HEAD", monkeypatch)


def test_few_blobs_are_read_one_by_one(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _calls(monkeypatch)
    refs = gitrepo.revision_refs(tree, "HEAD")[: gitrepo.BATCH_MIN - 1]
    files = loading._read_files(refs, list(range(len(refs))), None)
    assert calls == []  # the Repo's running cat-file read them
    assert [data for _, data in files] == [(tree / ref.name).read_bytes() for ref in refs]


def test_an_oversized_blob_is_read_cut_off_and_refused_by_size(
    tree: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tree / "allocations" / "big.yaml"
    big.write_bytes(b"# " + b"x" * (yamlio.MAX_FILE_BYTES + 10) + b"\n")
    _commit(tree, "big")
    calls = _calls(monkeypatch)
    refs = gitrepo.revision_refs(tree, "HEAD")
    files = dict(loading._read_files(refs, list(range(len(refs))), None))
    big_key = next(ref.key for ref in refs if ref.name == "allocations/big.yaml")
    assert reads == [big_key]  # only the oversized blob, by its cut-off read
    assert calls == [("--batch-check", len(refs) - 1), ("--batch", len(refs) - 2)]
    data = files["allocations/big.yaml"]
    assert isinstance(data, bytes) and len(data) == yamlio.MAX_FILE_BYTES + 1
    result = gitrepo.read_revision(tree, "HEAD")
    assert {x.file: x.code for x in result.errors} == {"allocations/big.yaml": "desired.yaml.too_large"}
    assert result == _one_by_one(tree, "HEAD", monkeypatch)


def _good_output(tree: Path, keys: list[str]) -> tuple[bytes, dict[str, int]]:
    with git.Repo(tree) as repo:
        sizes = gitrepo._blob_sizes(repo, keys)
        out = gitrepo._cat_file(repo, "--batch", keys)
    assert out is not None and set(sizes) == set(keys)
    return out, sizes


def _twisted(out: bytes, keys: list[str], sizes: dict[str, int]) -> Iterator[tuple[str, bytes]]:
    first = f"{keys[0]} blob {sizes[keys[0]]}\n".encode()
    yield "truncated", out[:-1]
    yield "a byte too many", out + b"\n"
    yield "a wrong size", out.replace(first, f"{keys[0]} blob {sizes[keys[0]] - 1}\n".encode(), 1)
    yield "missing", f"{keys[0]} missing\n".encode() + out[len(first) + sizes[keys[0]] + 1 :]
    yield "another object", out.replace(keys[0].encode(), keys[1].encode(), 1)
    yield "not a blob", out.replace(first, f"{keys[0]} tree {sizes[keys[0]]}\n".encode(), 1)
    after = len(first) + sizes[keys[0]]
    yield "no newline after a blob", out[:after] + b"X" + out[after + 1 :]
    yield "nothing", b""


def test_unexpected_batch_output_gives_no_bytes(tree: Path) -> None:
    refs = gitrepo.revision_refs(tree, "HEAD")[:5]
    keys = [ref.key for ref in refs if ref.key is not None]
    out, sizes = _good_output(tree, keys)
    with git.Repo(tree) as repo:
        assert gitrepo._cat_blobs(repo, keys, sizes) == {ref.key: (tree / ref.name).read_bytes() for ref in refs}
    for what, bad in _twisted(out, keys, sizes):
        assert bad != out, what

        def fake(repo: git.Repo, mode: str, asked: Sequence[str], bad: bytes = bad) -> bytes:
            return bad

        with pytest.MonkeyPatch.context() as m, git.Repo(tree) as repo:
            m.setattr(gitrepo, "_cat_file", fake)
            assert gitrepo._cat_blobs(repo, keys, sizes) == {}, what


@pytest.mark.parametrize("output", [None, b"", b"garbage\n", b"\n"])
def test_a_failed_or_odd_batch_falls_back_to_reading_each_blob(
    tree: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch, output: bytes | None
) -> None:
    plain = gitrepo._cat_file

    def broken(repo: git.Repo, mode: str, keys: Sequence[str]) -> bytes | None:
        return output if mode == "--batch" else plain(repo, mode, keys)

    monkeypatch.setattr(gitrepo, "_cat_file", broken)
    result = gitrepo.read_revision(tree, "HEAD")
    assert len(reads) == len(list(tree.rglob("*.yaml")))  # every blob read on its own
    assert result == _one_by_one(tree, "HEAD", monkeypatch)


def test_sizes_leave_out_missing_objects_and_refuse_odd_output(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [ref.key for ref in gitrepo.revision_refs(tree, "HEAD")[:3] if ref.key is not None]
    with git.Repo(tree) as repo:
        sizes = gitrepo._blob_sizes(repo, [keys[0], MISSING, keys[1]])
        assert set(sizes) == {keys[0], keys[1]}
        assert sizes[keys[0]] == len(repo.odb.stream(bytes.fromhex(keys[0])).read())
        tree_id = repo.head.commit.tree.hexsha
        assert gitrepo._blob_sizes(repo, [keys[0], tree_id]) == {}  # a tree where a blob was named
        monkeypatch.setattr(gitrepo, "_cat_file", lambda *_: f"{keys[0]} blob 12\n".encode())
        assert gitrepo._blob_sizes(repo, keys) == {}  # fewer lines than ids


def test_a_missing_blob_fails_as_its_own_read_does(tree: Path, reads: list[str]) -> None:
    refs = gitrepo.revision_refs(tree, "HEAD")

    def read() -> safefiles.FileData:
        raise LookupError(MISSING)

    gone = loading.FileRef("allocations/gone.yaml", MISSING, read, refs[0].read_many)
    with pytest.raises(LookupError):  # never bytes from elsewhere
        loading._read_files([*refs, gone], list(range(len(refs) + 1)), None)
    assert reads == []  # the others came from the batch


def test_cancel_stops_between_batches(tree: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gitrepo, "BATCH_BYTES", 1)  # one blob per cat-file call
    calls = _calls(monkeypatch)
    refs = gitrepo.revision_refs(tree, "HEAD")
    polls: list[None] = []

    def cancel() -> bool:  # asked before the first batch, then after each: stop after the first
        polls.append(None)
        return len(polls) > 1

    with pytest.raises(loading.Cancelled):
        loading.blobs_for(refs, cancel=cancel)
    assert calls == [("--batch-check", len(refs) - 1), ("--batch", 1)]
    assert reads == []
