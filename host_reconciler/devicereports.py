"""What the guest says it sees: the device report that readiness compares with the claim.

Seed 000 ("Slice VM Runtime Profiles"): readiness "requires a successful
`nvidia-smi -L` before it marks the slice VM guest ready". The seed's
announcer (`cloudinit`) posts, once the marker exists and then every minute,
a small text report to the host agent's listener (`drivers/guestmarker.py`):

    gpuaas-devices 1
    name gpuaas-alloc-1
    token 0123456789abcdef0123456789abcdef
    tool nvidia-smi                       (amd-smi, rocm-smi on MI300X; none)
    fabric mlx5_0 ACTIVE                  (one line per RDMA port the guest has)
    smi-begin
    GPU 0: NVIDIA H200 (UUID: GPU-2f6c...)
    smi-end

The token is the VM's announcement token (per allocation: an HMAC of its VM
name under the host's secret); the listener also requires the post to come
from the VM's reserved address. Pure: `parse` turns bytes into a
`GuestDevices` or refuses them with a stable code; `compare` says what does
not match the claim. The guest's own words (the tool's output) travel with a
mismatch, so the failure reason says what the guest saw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_BYTES = 16 * 1024  # 8 GPUs of nvidia-smi -L are ~800 bytes; amd-smi list ~2 KiB
MAX_WORDS = 2000  # characters of the tool's output kept in evidence and errors
TOOLS = ("nvidia-smi", "amd-smi", "rocm-smi", "none")
FABRIC_UP = frozenset({"ACTIVE"})  # /sys/class/infiniband/*/ports/*/state (IB and RoCE alike)

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_PORT = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_STATE = re.compile(r"^[A-Z_]{1,32}$")
_NVIDIA = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[0-9a-fA-F-]{8,64})\)\s*$")
_AMD_GPU = re.compile(r"^GPU: (\d+)\s*$")
_AMD_UUID = re.compile(r"^\s+UUID: ([0-9A-Za-z-]{4,64})\s*$")
_ROCM = re.compile(r"^GPU\[(\d+)\]\s*: Unique ID: (\S{2,64})\s*$")


class DeviceReportRefused(ValueError):
    """A report the listener does not store; `code` is counted (`guestmarker.Announcements.refused`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class GuestDevices:
    tool: str
    gpu_count: int
    uuids: tuple[str, ...]
    fabric: tuple[tuple[str, str], ...]  # (port, state)
    words: str  # the tool's output, capped: what the guest said

    def as_dict(self) -> dict[str, object]:
        return {
            "tool": self.tool,
            "gpu_count": self.gpu_count,
            "uuids": list(self.uuids),
            "fabric": [{"port": p, "state": s} for p, s in self.fabric],
            "words": self.words,
        }


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the claim gives the VM: one GPU per slot bundle, one fabric VF per bundle that names one."""

    gpus: int
    fabric_vfs: int


def parse(body: bytes) -> tuple[str, str, GuestDevices]:
    """(vm name, token, devices) of one report; DeviceReportRefused when it is not one."""
    if len(body) > MAX_BYTES:
        raise DeviceReportRefused("oversized", f"report of {len(body)} bytes (at most {MAX_BYTES})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DeviceReportRefused("malformed", "report is not UTF-8") from e
    lines = text.split("\n")
    if lines[0].strip() != "gpuaas-devices 1":
        raise DeviceReportRefused("malformed", "report does not start with 'gpuaas-devices 1'")
    head, rest = _head(lines[1:])
    if "smi-begin" not in [r.strip() for r in rest]:
        raise DeviceReportRefused("malformed", "report has no smi-begin section")
    words: list[str] = []
    for line in rest[1:]:
        if line.strip() == "smi-end":
            break
        words.append(line)
    name, token, tool = head.get("name", ""), head.get("token", ""), head.get("tool", "")
    if not _NAME.match(name) or not _TOKEN.match(token) or tool not in TOOLS:
        raise DeviceReportRefused("malformed", "report lacks a valid name, token or tool")
    fabric = tuple(_fabric(v) for v in head.get("fabric", "").split("\n") if v)
    count, uuids = _gpus(tool, words)
    return name, token, GuestDevices(tool, count, uuids, fabric, "\n".join(words).strip()[:MAX_WORDS])


def _head(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """The `key value` lines before smi-begin (fabric lines joined by newlines), and the lines from smi-begin."""
    head: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line.strip() == "smi-begin":
            return head, lines[i:]
        if not line.strip():
            continue
        key, _, value = line.partition(" ")
        if key == "fabric" and head.get("fabric", "").count("\n") < 64:
            head["fabric"] = head.get("fabric", "") + value.strip() + "\n"
        elif key in ("name", "token", "tool") and key not in head:
            head[key] = value.strip()
        else:
            raise DeviceReportRefused("malformed", f"unexpected line {line[:80]!r}")
    return head, []


def _fabric(value: str) -> tuple[str, str]:
    port, _, state = value.partition(" ")
    state = state.strip().split(":")[-1].strip()  # "4: ACTIVE" as sysfs writes it
    if not _PORT.match(port) or not _STATE.match(state):
        raise DeviceReportRefused("malformed", f"bad fabric line {value[:80]!r}")
    return port, state


def _gpus(tool: str, words: list[str]) -> tuple[int, tuple[str, ...]]:
    if tool == "nvidia-smi":
        found = [m for w in words if (m := _NVIDIA.match(w))]
        return len({m.group(1) for m in found}), tuple(m.group(2) for m in found)
    if tool == "amd-smi":
        ids = {m.group(1) for w in words if (m := _AMD_GPU.match(w))}
        return len(ids), tuple(m.group(1) for w in words if (m := _AMD_UUID.match(w)))
    if tool == "rocm-smi":
        found = [m for w in words if (m := _ROCM.match(w))]
        return len({m.group(1) for m in found}), tuple(m.group(2) for m in found)
    return 0, ()


def compare(expect: Expectation, got: GuestDevices) -> list[str]:
    """Why the guest's devices do not match the claim ([] when they do)."""
    problems: list[str] = []
    if got.gpu_count != expect.gpus:
        problems.append(f"the guest sees {got.gpu_count} GPU(s) with {got.tool}, the claim gives {expect.gpus}")
    if len(set(got.uuids)) != len(got.uuids):
        problems.append("the guest reports a GPU UUID twice")
    up = [p for p, s in got.fabric if s in FABRIC_UP]
    if len(up) < expect.fabric_vfs:
        seen = ", ".join(f"{p} {s}" for p, s in got.fabric) or "none"
        problems.append(
            f"{len(up)} fabric port(s) ACTIVE in the guest, the claim gives {expect.fabric_vfs} VF(s) (seen: {seen})"
        )
    return problems
