"""What the reader reads: only regular files inside the repo, once per blob (issue 10).

Hostile trees: a symlink out of the repo (`allocations/x.yaml -> /etc/shadow`),
a FIFO, a symlink to /dev/zero, a symlinked directory, a symlink committed to
git. Each is refused by path with a stable code before a byte is read, and
nothing hangs. The blob cache is an optimisation only: over random edit
sequences, loading with the cache gives exactly what loading without it gives.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest

from desired.reading import gitrepo, loading, safefiles
from desired.state import LoadResult
from policies import validation
from reconciler import cli, sources
from reconciler.caches.blobs import BlobCache

pytestmark = pytest.mark.integration  # real git repositories and subprocesses

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
ROOT = Path(__file__).resolve().parents[2]
SECRET = "root:$6$not-a-real-hash-but-secret"  # noqa: S105 - a fake shadow line, the bait


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    return root


def _codes(root: Path, rev: str | None = None) -> dict[str, str]:
    result = sources.load(root, rev)
    return {p.file: p.code for p in result.errors}


def test_symlinks_fifos_and_devices_are_refused_by_path_without_reading(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "shadow"
    outside.write_text(f"apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nid: {SECRET}\n")
    (tree / "allocations" / "x.yaml").symlink_to(outside)
    (tree / "allocations" / "zero.yaml").symlink_to("/dev/zero")
    os.mkfifo(tree / "allocations" / "pipe.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.yaml").write_text("kind: Allocation\n")
    (tree / "linked").symlink_to(elsewhere)
    codes = _codes(tree)
    assert codes == {
        "allocations/x.yaml": "desired.file.symlink",
        "allocations/zero.yaml": "desired.file.symlink",
        "allocations/pipe.yaml": "desired.file.not_regular",
        "linked": "desired.file.symlink",
    }
    # As a user runs it: exit 1, every refusal named, nothing from the linked file echoed, no hang.
    done = subprocess.run(
        [sys.executable, "-m", "reconciler.cli", "validate", str(tree)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 1
    assert "allocations/pipe.yaml:1:1: desired.file.not_regular" in done.stdout + done.stderr
    assert "secret" not in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_a_symlink_committed_to_git_is_refused_at_a_revision(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "passwd.yaml"
    outside.write_text("kind: Fleet\n")
    (tree / "allocations" / "x.yaml").symlink_to(outside)
    repo = git.Repo.init(tree)
    repo.git.add("-A")
    repo.index.commit("with a link", author=git.Actor("t", "t@example.com"))
    assert _codes(tree, "HEAD") == {"allocations/x.yaml": "desired.file.symlink"}


def test_a_file_past_the_size_cap_is_refused_by_what_was_read(tree: Path) -> None:
    big = tree / "allocations" / "big.yaml"
    big.write_bytes(b"# " + b"x" * (safefiles.MAX_FILE_BYTES + 10) + b"\n")
    data = safefiles.read_regular(big)
    assert isinstance(data, bytes) and len(data) == safefiles.MAX_FILE_BYTES + 1
    assert _codes(tree) == {"allocations/big.yaml": "desired.yaml.too_large"}


def _picture(result: LoadResult) -> tuple[list[str], dict[str, str]]:
    s = result.state
    models = {
        f"{kind}/{name}": obj.model_dump_json()
        for kind, table in (
            ("Sku", s.skus),
            ("Image", s.images),
            ("Node", s.nodes),
            ("SlotMap", s.slot_maps),
            ("Allocation", s.allocations),
        )
        for name, obj in table.items()
    }
    if s.fleet is not None:
        models["Fleet"] = s.fleet.model_dump_json()
    return [p.render() for p in result.problems], models


def _edit(rng: random.Random, root: Path, pool: list[Path]) -> None:
    files = sorted(root.rglob("*.yaml"))
    what = rng.random()
    target = rng.choice(files)
    if what < 0.25:  # a new copy of a document under another name (duplicates, then renames)
        src = rng.choice(pool)
        shutil.copy(src, root / "allocations" / f"copy-{rng.randrange(1000)}.yaml")
    elif what < 0.45 and len(files) > 5:
        target.unlink()
    elif what < 0.65:  # introduce an error
        text = target.read_text()
        target.write_text(text.replace("apiVersion", "apiVersoin", 1) if rng.random() < 0.5 else text + "\tbad: [\n")
    elif what < 0.85:  # fix it again: the original bytes come back (a blob seen before)
        rel = target.relative_to(root)
        if (EXAMPLE / rel).exists():
            shutil.copy(EXAMPLE / rel, target)
    else:  # the same bytes moved to another path
        target.rename(target.with_name(f"moved-{rng.randrange(1000)}.yaml"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_blob_cache_gives_exactly_what_a_full_load_gives(tree: Path, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test randomness
    pool = sorted(EXAMPLE.rglob("*.yaml"))
    cache = BlobCache()
    for _ in range(40):
        _edit(rng, tree, pool)
        files = list(safefiles.iter_directory(tree))
        warm = validation.validate(loading.parse_files(files, cache=cache))
        cold = validation.validate(loading.parse_files(files))
        assert _picture(warm) == _picture(cold)
    assert cache.hits > cache.misses  # it did save work
    assert len(cache) <= 2 * len(files) + 10  # and keeps only what recent trees hold


def test_a_new_revision_reads_only_the_blobs_it_changed(tree: Path) -> None:
    repo = git.Repo.init(tree)
    repo.git.add("-A")
    repo.index.commit("base", author=git.Actor("t", "t@example.com"))
    cache = BlobCache()
    first = sources.load(tree, "HEAD", cache=cache)
    assert (cache.hits, cache.misses) == (0, first.state.file_count)
    shutil.copy(EXAMPLE / "allocations" / "alloc-0001.yaml", tree / "allocations" / "alloc-0100.yaml")
    (tree / "allocations" / "alloc-0100.yaml").write_text(
        (tree / "allocations" / "alloc-0100.yaml").read_text().replace("alloc-0001", "alloc-0100")
    )
    repo.git.add("-A")
    repo.index.commit("one more", author=git.Actor("t", "t@example.com"))
    reads: list[str] = []
    refs = [loading.FileRef(r.name, r.key, _counting(r, reads)) for r in gitrepo.revision_refs(tree, "HEAD")]
    second = validation.validate(loading.parse_refs(refs, cache=cache))
    assert reads == ["allocations/alloc-0100.yaml"]
    assert _picture(second) == _picture(sources.load(tree, "HEAD"))
    assert cli.main(["validate", str(tree), "--rev", "HEAD"]) == 0


def _counting(ref: loading.FileRef, reads: list[str]) -> loading.Callable[[], safefiles.FileData]:
    def read() -> safefiles.FileData:
        reads.append(ref.name)
        return ref.read()

    return read
