"""Guest GPU telemetry (seed 002 section 8): what the tenant's GPUs report from inside the slice VM.

Host `nvidia-smi` is misleading once GPUs are bound to vfio-pci, so the seed's
announcer samples inside the guest, on an interval, and posts with the VM's
own token to the host agent's listener (`drivers/guestmarker.py`):

    gpuaas-telemetry 1
    name gpuaas-alloc-1
    token 0123456789abcdef0123456789abcdef
    gpu 0, GPU-2f6c..., 87, 40960, 143771, 61, 0, 0

one `gpu` line per GPU: `nvidia-smi --query-gpu=index,uuid,utilization.gpu,
memory.used,memory.total,temperature.gpu,ecc.errors.corrected.volatile.total,
ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits`. A field
the tool reports as `[N/A]` (or anything not a number) is None, "unavailable",
never 0. Pure: `parse` and the `Sample` value; the listener keeps a bounded,
rate-limited buffer per VM and the agent reports the newest sample per
allocation with its host status.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_BYTES = 4096  # 8 GPUs of the line above are ~700 bytes
MAX_GPUS = 16
MIN_INTERVAL_S = 5.0  # a guest posting faster is refused (rate_limited), counted
BUFFER = 12  # samples kept per VM (the newest is reported)
MAX_VMS = 256  # VMs with a buffer at once; the stalest is dropped past it

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
_TOKEN = re.compile(r"^[0-9a-f]{32}$")
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{8,64}$")
FIELDS = ("utilization_pct", "memory_used_mib", "memory_total_mib", "temperature_c", "ecc_corrected", "ecc_uncorrected")


class TelemetryRefused(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str | None
    utilization_pct: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None

    def as_dict(self) -> dict[str, object]:
        return {"index": self.index, "uuid": self.uuid, **{f: getattr(self, f) for f in FIELDS}}


@dataclass(frozen=True, slots=True)
class Sample:
    gpus: tuple[GpuSample, ...]

    def as_dict(self) -> dict[str, object]:
        return {"gpus": [g.as_dict() for g in self.gpus]}


def _number(text: str, *, limit: int) -> int | None:
    text = text.strip()
    if not text.isdigit() or len(text) > 12:
        return None  # "[N/A]", "[Not Supported]", "": unavailable, not zero
    value = int(text)
    return value if value <= limit else None


def parse(body: bytes) -> tuple[str, str, Sample]:
    """(vm name, token, sample); TelemetryRefused (oversized | malformed) otherwise."""
    if len(body) > MAX_BYTES:
        raise TelemetryRefused("oversized", f"telemetry of {len(body)} bytes (at most {MAX_BYTES})")
    try:
        lines = body.decode("ascii").split("\n")
    except UnicodeDecodeError as e:
        raise TelemetryRefused("malformed", "telemetry is not ASCII") from e
    if lines[0].strip() != "gpuaas-telemetry 1":
        raise TelemetryRefused("malformed", "telemetry does not start with 'gpuaas-telemetry 1'")
    head: dict[str, str] = {}
    gpus: list[GpuSample] = []
    for line in lines[1:]:
        key, _, value = line.strip().partition(" ")
        if not key:
            continue
        if key in ("name", "token") and key not in head:
            head[key] = value.strip()
        elif key == "gpu" and len(gpus) < MAX_GPUS:
            gpus.append(_gpu(value))
        else:
            raise TelemetryRefused("malformed", f"unexpected line {line[:80]!r}")
    name, token = head.get("name", ""), head.get("token", "")
    if not _NAME.match(name) or not _TOKEN.match(token):
        raise TelemetryRefused("malformed", "telemetry lacks a valid name or token")
    if len({g.index for g in gpus}) != len(gpus):
        raise TelemetryRefused("malformed", "a GPU index appears twice")
    return name, token, Sample(tuple(gpus))


def _gpu(value: str) -> GpuSample:
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != 8 or not parts[0].isdigit() or int(parts[0]) >= MAX_GPUS:
        raise TelemetryRefused("malformed", f"bad gpu line {value[:80]!r}")
    uuid = parts[1] if _UUID.match(parts[1]) else None
    return GpuSample(
        int(parts[0]),
        uuid,
        _number(parts[2], limit=100),
        _number(parts[3], limit=1 << 24),
        _number(parts[4], limit=1 << 24),
        _number(parts[5], limit=200),
        _number(parts[6], limit=10**12),
        _number(parts[7], limit=10**12),
    )
