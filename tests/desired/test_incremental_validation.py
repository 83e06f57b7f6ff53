"""Incremental cross-file validation (`policies.validationmemo.Memo`) gives exactly what a full run gives.

Random edit sequences on a copy of examples/fleet: documents added (copies:
duplicate names), deleted (a SKU, a node, the Fleet: dangling references),
changed to break a cross-file rule (a MAC taken from another node's map, one
machine or one ingress address behind two nodes, an unknown SKU, region or
image, the OS disk used as a slot disk, an IP outside the subnet, a GPU count
the SKU does not allow), fixed again (the original
bytes come back), moved to another path, or broken as YAML. After every
step the problems of the incremental run, rendered with FILE:LINE:COL and in
order, equal those of a full run from nothing.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from desired.reading import loading, safefiles
from desired.state import LoadResult
from policies import validation, validationmemo
from reconciler.caches.blobs import BlobCache

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet"
_MAC = re.compile(r'mac_address: "([0-9a-f:]+)"')


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "desired"
    shutil.copytree(EXAMPLE, root)
    return root


def _replace(path: Path, rng: random.Random, pattern: str, new: str) -> None:
    if not path.exists():
        return
    text = path.read_text()
    hits = [m for m in re.finditer(pattern, text, re.MULTILINE)]
    if hits:
        m = rng.choice(hits)
        path.write_text(text[: m.start()] + new + text[m.end() :])


def _steal_mac(rng: random.Random, root: Path) -> None:
    maps = sorted((root / "slotmaps").glob("*.yaml")) if (root / "slotmaps").exists() else []
    if len(maps) < 2:
        return
    donor, target = rng.sample(maps, 2)
    macs = _MAC.findall(donor.read_text())
    if macs:
        _replace(target, rng, r'mac_address: "[0-9a-f:]+"', f'mac_address: "{rng.choice(macs)}"')


def _edit(rng: random.Random, root: Path, pool: list[Path]) -> None:
    files = sorted(root.rglob("*.yaml"))
    target = rng.choice(files)
    what = rng.randrange(14)
    if what == 0:  # a copy of a document under another name: duplicate names
        src = rng.choice(pool)
        dest = root / src.parent.relative_to(EXAMPLE) / f"copy-{rng.randrange(100)}.yaml"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    elif what == 1 and len(files) > 5:  # delete any document: the Fleet, a SKU, a node, a map
        target.unlink()
    elif what in (2, 3):  # fix: the original bytes come back, deleted files too
        rel = rng.choice(pool).relative_to(EXAMPLE)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXAMPLE / rel, root / rel)
    elif what == 4:
        _steal_mac(rng, root)
    elif what == 5:
        _replace(
            target,
            rng,
            r"^(sku|baremetal_sku): \S+",
            rng.choice(["sku: h200-sxm-baremetal-8g", "sku: nope", "baremetal_sku: h200-sxm-slice"]),
        )
    elif what == 6:
        _replace(target, rng, r"^region: \S+", rng.choice(["region: us-east-1", "region: mars-1"]))
    elif what == 7:  # the fleet or a SKU changes: every rule may read them
        _replace(root / "fleet.yaml" if rng.random() < 0.5 else target, rng, r"name: \S+", "name: renamed")
    elif what == 8:
        _replace(target, rng, r"private_ip: \S+", rng.choice(["private_ip: 192.0.2.7", "private_ip: 10.100.0.10"]))
    elif what == 9:
        _replace(target, rng, r"nvme_device: \S+", "nvme_device: /dev/disk/by-id/nvme-BOSS_OS")
        _replace(target, rng, r"os_disk: \S+", "os_disk: /dev/disk/by-id/nvme-BOSS_OS")
    elif what == 10:
        _replace(target, rng, r"^(gpu_count|image): \S+", rng.choice(["gpu_count: 3", "image: nope", "gpu_count: 8"]))
    elif what == 12:  # cross-node: one machine behind two nodes
        ironic = [f for f in files if "provider: ironic-use1" in f.read_text()]
        if ironic:
            _replace(
                rng.choice(ironic),
                rng,
                r"machine_id: \S+",
                rng.choice(["machine_id: h200-use1-b01", "machine_id: h200-use1-b02"]),
            )
    elif what == 13:  # cross-node: two nodes' ingress ranges on one address
        _replace(target, rng, r"^  address: \S+", "  address: 203.0.113.11")
    elif what == 11:
        if rng.random() < 0.5:  # the same bytes at another path
            target.rename(target.with_name(f"moved-{rng.randrange(100)}.yaml"))
        else:
            target.write_text(target.read_text().replace("apiVersion", "apiVersoin", 1))


def _rendered(result: LoadResult) -> list[str]:
    return [f"{p.severity}:{p.render()}" for p in result.problems]


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_incremental_validation_equals_a_full_run_after_every_edit(tree: Path, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - test randomness
    pool = sorted(EXAMPLE.rglob("*.yaml"))
    cache, memo = BlobCache(), validationmemo.Memo()
    reused = checked = 0
    for _ in range(60):
        _edit(rng, tree, pool)
        files = list(safefiles.iter_directory(tree))
        warm = memo.validate(loading.parse_files(files, cache=cache))
        cold = validation.validate(loading.parse_files(files))
        assert _rendered(warm) == _rendered(cold)
        reused, checked = reused + memo.reused, checked + memo.checked
    assert memo.fallbacks == 0
    assert reused > checked  # it did save work


@pytest.mark.parametrize("seed", [7, 8])
def test_a_blank_memo_validating_once_gives_the_walk_s_problems_and_shared_macs(tree: Path, seed: int) -> None:
    """`validate_once` (the whole rules, then `adopt`) is what a memo's own first walk gives."""
    rng = random.Random(seed)  # noqa: S311 - test randomness
    pool = sorted(EXAMPLE.rglob("*.yaml"))
    for _ in range(25):
        _edit(rng, tree, pool)
        files = list(safefiles.iter_directory(tree))
        once, walked = validationmemo.Memo(), validationmemo.Memo()
        quick = once.validate_once(loading.parse_files(files))
        assert _rendered(quick) == _rendered(walked.validate(loading.parse_files(files)))
        assert once.owners == walked.owners


def test_a_mac_taken_from_an_earlier_map_is_reported_on_the_later_one_and_cleared_when_fixed(tree: Path) -> None:
    """The unchanged map whose MAC another map takes gets no problem; the taker does; fixing clears both."""
    cache, memo = BlobCache(), validationmemo.Memo()

    def problems() -> list[str]:
        files = list(safefiles.iter_directory(tree))
        warm = memo.validate(loading.parse_files(files, cache=cache))
        cold = validation.validate(loading.parse_files(files))
        assert _rendered(warm) == _rendered(cold)
        return [p.render() for p in warm.problems if p.code == "desired.slot.duplicate_mac"]

    assert problems() == []
    taken = _MAC.findall((tree / "slotmaps" / "h200-use1-s01.yaml").read_text())[0]
    later = tree / "slotmaps" / "h200-use1-s02.yaml"
    original = later.read_text()
    later.write_text(original.replace(_MAC.findall(original)[3], taken, 1))
    found = problems()
    assert len(found) == 1
    assert found[0].startswith("slotmaps/h200-use1-s02.yaml:")
    assert f"MAC {taken} is already used by h200-use1-s01 slots[0]" in found[0]
    assert memo.checked == 1  # only the changed map ran its rules again
    (tree / "slotmaps" / "h200-use1-s01.yaml").unlink()  # the first owner goes: the later map owns it now
    assert problems() == []
    later.write_text(original)
    assert problems() == []


def test_an_error_inside_the_incremental_path_falls_back_to_a_full_run(tree: Path) -> None:
    memo = validationmemo.Memo()
    files = list(safefiles.iter_directory(tree))
    memo._kept = None  # type: ignore[assignment] - damage its memory: the next run must not trust it
    memo._context = ()
    result = memo.validate(loading.parse_files(files))
    assert _rendered(result) == _rendered(validation.validate(loading.parse_files(files)))
    assert memo.fallbacks == 1
    assert "TypeError" in memo.last_fallback or "AttributeError" in memo.last_fallback
