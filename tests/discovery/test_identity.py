"""Disk identity in the approval: what discovery records, what validation accepts.

    SlotMap slot ── nvme_device: /dev/disk/by-id/nvme-SAMSUNG_..._S6EXNA0W400   (a link)
                └─ nvme_identity: {model, serial, wwid, size_bytes}           (the disk behind it)

The host compares the identity with sysfs before every write, wipe and
verify (tests/host/test_identity.py); here: the recorded values are typed and
sane, and discovery never records a value the schema cannot hold.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pydantic
import pytest

from desired import models as m
from host_reconciler.discovery import candidates
from reconciler import sources
from tests.discovery.conftest import FLEET
from tests.discovery.test_candidates import disk

GOOD = {
    "model": "SAMSUNG MZWLR3T8HBLS-00007",
    "serial": "S6EXNA0W400",
    "wwid": "eui.0025388500001c0a",
    "size_bytes": 3840755982336,
}


@pytest.mark.parametrize(
    "doc",
    [
        GOOD,
        {"serial": "S6EXNA0W400", "size_bytes": 512},
        {"wwid": "nvme.144d-5336-53414d-00000001", "size_bytes": 4096},
        {"wwid": "uuid.2d6c0b1a-9a0c-4f3e-8a51-3e0d2c6b7a10", "size_bytes": 4096},
        {"backing_file": "/var/lib/lab/disks/nvme-S0.img", "size_bytes": 16 << 20},
        {"model": "Dell BOSS-N1", "serial": "S6 EXNA 0W1OS", "size_bytes": 480103981056},
    ],
)
def test_sane_identities_are_accepted(doc: dict[str, Any]) -> None:
    assert m.NvmeIdentity.model_validate(doc).size_bytes == doc["size_bytes"]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"size_bytes": 3840755982337}, "not whole 512-byte sectors"),
        ({"size_bytes": 0}, "empty disk"),
        ({"size_bytes": "3840755982336"}, "a string is not an integer (strict)"),
        ({"size_bytes": 3840755982336.0}, "a float is not an integer (strict)"),
        ({"size_bytes": None}, "size is required"),
        ({"serial": None, "wwid": None}, "a size and a model identify nothing"),
        ({"serial": "S6EXNA0W400 "}, "sysfs values are stripped"),
        ({"serial": "S6EXNA\n0W400"}, "control character"),
        ({"serial": "S6EXNA0W400é"}, "not ASCII"),
        ({"serial": "x" * 65}, "too long"),
        ({"serial": 400}, "not a string"),
        ({"wwid": "0025388500001c0a"}, "wwid without its eui./nvme./uuid. form"),
        ({"wwid": "eui.00 25"}, "blank in a wwid"),
        ({"backing_file": "disks/nvme-S0.img"}, "relative backing file"),
        ({"eui": "0025388500001c0a"}, "unknown field"),
    ],
)
def test_insane_identities_are_refused(change: dict[str, Any], why: str) -> None:
    doc = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(pydantic.ValidationError):
        m.NvmeIdentity.model_validate(doc)


def test_validate_points_at_the_bad_identity_line(tmp_path: Path) -> None:
    repo = tmp_path / "fleet"
    shutil.copytree(FLEET, repo)
    path = repo / "slotmaps" / "h200-use1-c01.yaml"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip() == "size_bytes: 3840755982336")
    lines[at] = lines[at].replace("3840755982336", "1000")
    path.write_text("".join(lines))
    result = sources.load(repo)
    assert [(e.code, e.file, e.line) for e in result.errors] == [
        ("desired.field.value", "slotmaps/h200-use1-c01.yaml", at + 1)
    ]


def test_example_identities_load() -> None:
    state = sources.load(FLEET).state
    recorded = {name: [s.nvme_identity for s in smap.slots] for name, smap in state.slot_maps.items()}
    # Every approval binds disks, not names: a slot without one is never scheduled (disk.identity_missing).
    assert len(recorded) == 5 and all(i is not None for slots in recorded.values() for i in slots)


@pytest.mark.parametrize(
    ("change", "want"),
    [
        ({}, {"model": "TEST", "serial": "nvme0n1", "size_bytes": 10**12}),
        (
            {"wwid": "eui.0025388500001c0a"},
            {"model": "TEST", "serial": "nvme0n1", "wwid": "eui.0025388500001c0a", "size_bytes": 10**12},
        ),
        ({"wwid": "t10.ATA SAMSUNG"}, {"model": "TEST", "serial": "nvme0n1", "size_bytes": 10**12}),
        ({"serial": "Sé1", "wwid": "eui.01"}, {"model": "TEST", "wwid": "eui.01", "size_bytes": 10**12}),
        ({"model": None, "serial": None, "wwid": "eui.01"}, {"wwid": "eui.01", "size_bytes": 10**12}),
        ({"serial": None}, None),  # neither serial nor wwid: no identity, never a guess
        ({"serial": "bad\tserial"}, None),
        ({"size_bytes": 0}, None),
    ],
)
def test_discovery_records_only_what_the_schema_holds(change: dict[str, Any], want: dict[str, Any] | None) -> None:
    found = dataclasses.replace(disk("nvme0n1", "0000:12:00.0", "a", 0), **change)
    got = candidates.nvme_identity(found)
    assert got == want
    if got is not None:
        m.NvmeIdentity.model_validate(got)
