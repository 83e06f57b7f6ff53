"""What a host proves about its own onboarding: firmware evidence and bootstrap state.

Firmware (seed 003 section 1): the deploy-time helper records its evidence
in `/var/lib/gpuaas/firmware-profile/state.json`:

    {"profile_tag": "gpuaas-profile-slice-vm",
     "profile_version": "h200-xe9680l-slice-vm-v1",
     "verified": true, "verified_at": "2026-04-17T10:00:00Z",
     "expected": {"BIOS.ProcSettings.ProcVirtualization": "Enabled", ...},
     "observed": {"BIOS.ProcSettings.ProcVirtualization": "Enabled", ...}}

`firmware_ready` is true only when the helper verified its profile version
and every expected attribute reads back as expected (for the slice profile,
at least the seed's minimum: virtualization, logical processors, SR-IOV).
No directory at all: None, and the git onboarding claim stands; anything
else that does not prove readiness is false, with a stable code and the
evidence, so capability follows the host's evidence.

Bootstrap: `gpuaas host bootstrap` writes `<bootstrap_dir>/state.json`
(state, checks, the files it wrote and their sha256, the boot id). A reboot
it asked for is required until the boot id changes.
"""

from __future__ import annotations

import datetime as dt
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from host_reconciler import bootstrapping
from schemas import hostreports as hr

SLICE_PROFILE = "gpuaas-profile-slice-vm"
SLICE_MINIMUM = (
    "BIOS.ProcSettings.ProcVirtualization",
    "BIOS.ProcSettings.LogicalProc",
    "BIOS.IntegratedDevices.SriovGlobalEnable",
)
MAX_EVIDENCE_BYTES = 256 * 1024
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def agent_version() -> str:
    try:
        return metadata.version("gpuaas-reconciler")
    except metadata.PackageNotFoundError:
        return "unknown"


def _load(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(document, None) or (None, why it is not one)."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_EVIDENCE_BYTES + 1)
    except FileNotFoundError:
        return None, f"{path} is missing"
    except OSError as e:
        return None, f"{path}: {e.strerror}"
    if len(raw) > MAX_EVIDENCE_BYTES:
        return None, f"{path} is larger than {MAX_EVIDENCE_BYTES} bytes"
    try:
        doc = json.loads(raw)
    except ValueError as e:
        return None, f"{path} is not JSON: {e}"
    if not isinstance(doc, dict):
        return None, f"{path} is not a JSON object"
    return doc, None


def firmware(directory: Path) -> tuple[bool | None, str, dict[str, Any]]:
    """(firmware_ready, code, evidence) from the helper's evidence directory."""
    if not directory.is_dir():
        return None, hr.FIRMWARE_NO_EVIDENCE, {"directory": str(directory)}
    doc, why = _load(directory / "state.json")
    if doc is None:
        return False, hr.FIRMWARE_INVALID, {"directory": str(directory), "error": why}
    got_expected, got_observed = doc.get("expected"), doc.get("observed")
    expected: dict[str, Any] = got_expected if isinstance(got_expected, dict) else {}
    observed: dict[str, Any] = got_observed if isinstance(got_observed, dict) else {}
    evidence = {k: doc.get(k) for k in ("profile_tag", "profile_version", "verified", "verified_at")}
    evidence.update(expected=expected, observed=observed)
    if doc.get("verified") is not True or not doc.get("profile_version"):
        return False, hr.FIRMWARE_NOT_VERIFIED, evidence
    need = dict(expected)
    if doc.get("profile_tag") == SLICE_PROFILE:
        for attr in SLICE_MINIMUM:
            need.setdefault(attr, "Enabled")
    wrong = sorted(a for a, v in need.items() if str(observed.get(a)) != str(v))
    if wrong:
        evidence["mismatched"] = wrong
        return False, hr.FIRMWARE_MISMATCH, evidence
    return True, hr.FIRMWARE_READY, evidence


def read_state(directory: Path) -> dict[str, Any] | None:
    doc, _ = _load(directory / "state.json")
    return doc


def boot_id(path: Path = BOOT_ID) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def write_state(
    directory: Path,
    plan: bootstrapping.Plan,
    *,
    written: dict[str, str],
    error: str | None,
    applied: bool,
    boot: str | None,
) -> dict[str, Any]:
    """Record a bootstrap run (write aside, rename); returns the document."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    doc: dict[str, Any] = {
        **plan.as_dict(),
        "state": str(bootstrapping.State.FAILED) if error else str(plan.state),
        "error": error,
        "checked_at": now,
        "applied_at": now if applied else (read_state(directory) or {}).get("applied_at"),
        "written": written,
        "boot_id": boot,
        "agent_version": agent_version(),
    }
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / ".state.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    tmp.replace(directory / "state.json")
    return doc


def report(
    firmware_dir: Path,
    bootstrap_dir: Path,
    *,
    reboot_flag: Path = Path("/run/reboot-required"),
    boot: str | None = None,
) -> hr.HostReport:
    """This host's report for host_status: read every pass (small files, no program run)."""
    ready, code, evidence = firmware(firmware_dir)
    state = read_state(bootstrap_dir)
    reasons: list[str] = []
    if reboot_flag.exists():
        reasons.append(f"{reboot_flag} exists")
    bootstrap_state, checked = hr.BOOTSTRAP_NEVER, None
    if state is not None:
        bootstrap_state = str(state.get("state")) if state.get("state") in hr.BOOTSTRAP_STATES else "failed"
        checked = str(state.get("checked_at")) if state.get("checked_at") else None
        current = boot if boot is not None else boot_id()
        if state.get("reboot_required") is True and (current is None or current == state.get("boot_id")):
            reasons.append("bootstrap staged changes that take effect at the next boot")
    return hr.HostReport(
        agent_version=agent_version(),
        firmware_ready=ready,
        firmware_code=code,
        firmware_evidence=evidence,
        bootstrap_state=bootstrap_state,
        bootstrap_checked_at=checked,
        reboot_required=bool(reasons),
        reboot_reasons=tuple(reasons),
    )
