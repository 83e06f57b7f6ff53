"""Every validation rule, one broken document each: the right code at the right FILE:LINE.

Each file under broken/ starts with `# expect: CODE` and marks the line the
error must point at with `# <-- error` (or says `# line: any`). The file is
dropped into a copy of examples/fleet, so everything else is valid and the
broken document must produce exactly one error.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from reconciler import sources

HERE = Path(__file__).parent
EXAMPLE = HERE.parent.parent / "examples" / "fleet"
CASES = sorted((HERE / "broken").glob("*.yaml"))


def _expectation(text: str) -> tuple[str, int | None]:
    code = re.search(r"^# expect: (\S+)$", text, re.MULTILINE)
    assert code, "case file needs '# expect: CODE'"
    if re.search(r"^# line: any$", text, re.MULTILINE):
        return code.group(1), None
    lines = [i for i, line in enumerate(text.splitlines(), 1) if "# <-- error" in line]
    assert len(lines) == 1, "case file needs exactly one '# <-- error' marker"
    return code.group(1), lines[0]


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    root = tmp_path / "fleet"
    shutil.copytree(EXAMPLE, root)
    return root


def test_example_fleet_is_valid() -> None:
    result = sources.load(EXAMPLE)
    assert result.errors == []
    assert len(result.state.nodes) == 8


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_broken_document(case: Path, fleet: Path) -> None:
    text = case.read_text()
    code, line = _expectation(text)
    (fleet / "zz-case").mkdir()  # sorts last: duplicates are reported on the later file
    shutil.copy(case, fleet / "zz-case" / case.name)
    result = sources.load(fleet)
    rendered = [e.render() for e in result.errors]
    assert len(result.errors) == 1, rendered
    error = result.errors[0]
    assert error.code == code, rendered
    assert error.file == f"zz-case/{case.name}"
    if line is not None:
        assert error.line == line, rendered


def _single_error(fleet: Path, name: str, data: bytes) -> tuple[str, str, int, int]:
    (fleet / name).write_bytes(data)
    result = sources.load(fleet)
    assert len(result.errors) == 1, [e.render() for e in result.errors]
    e = result.errors[0]
    return e.code, e.file, e.line, e.column


def test_non_utf8_bytes_point_at_the_byte(fleet: Path) -> None:
    data = b"apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\ntenant: acm\xe9\n"
    assert _single_error(fleet, "latin1.yaml", data) == ("desired.yaml.encoding", "latin1.yaml", 3, 12)


def test_absurd_nesting_is_refused_without_crashing(fleet: Path) -> None:
    # libyaml's composer recurses in C and kills the interpreter near 100k levels.
    data = b"apiVersion: gpuaas.io/v1alpha1\nkind: Allocation\nssh_keys: " + b"[" * 1_000_000 + b"\n"
    code, file, line, _ = _single_error(fleet, "deep.yaml", data)
    assert (code, file, line) == ("desired.yaml.too_deep", "deep.yaml", 3)


def test_oversized_file_is_refused(fleet: Path) -> None:
    data = b"# " + b"x" * (5 * 1024 * 1024) + b"\n"
    assert _single_error(fleet, "huge.yaml", data)[0] == "desired.yaml.too_large"


def test_every_problem_is_reported_at_once(fleet: Path) -> None:
    for case in ("field_unknown", "slot_duplicate_vf", "ref_allocation_sku"):
        shutil.copy(HERE / "broken" / f"{case}.yaml", fleet / f"{case}.yaml")
    codes = sorted(e.code for e in sources.load(fleet).errors)
    assert codes == ["desired.field.unknown", "desired.ref.unresolved", "desired.slot.duplicate_vf"]


def test_unschedulable_slots_are_warnings_naming_why() -> None:
    result = sources.load(EXAMPLE)
    warnings = [w for w in result.warnings if w.code == "desired.slot.unschedulable"]
    assert len(warnings) == 8
    assert all(w.file == "slotmaps/h200-use1-c01.yaml" for w in warnings)
    assert all("per_slot_vf" in w.message for w in warnings)


@pytest.mark.parametrize(
    ("ip", "ok"),
    [("10.100.0.10", True), ("10.100.0.300", False), ("10.100.0", False), ("fd00::10", True), ("010.1.1.1", False)],
)
def test_private_ip_parsing(ip: str, ok: bool) -> None:
    from pydantic import ValidationError

    from desired import models as m

    fields = {
        "slot_index": 0,
        "gpu_pci_address": "0000:1b:00.0",
        "gpu_model": "h200",
        "numa_node": 0,
        "slot_group": "numa0",
        "nvme_device": "/dev/disk/by-id/nvme-a",
        "network_fabric": "infiniband",
        "mac_address": "52:54:00:00:00:01",
        "private_ip": ip,
    }
    if ok:
        assert m.Slot.model_validate(fields).private_ip == ip
    else:
        with pytest.raises(ValidationError):
            m.Slot.model_validate(fields)
