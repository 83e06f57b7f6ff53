"""Running host tools (wipefs, blkdiscard, blkid, qemu-img, genisoimage) safely.

argv lists only, never a shell; every value that reaches an argv was checked
by its caller (a resolved block device, a path inside a state directory) and
is placed where it cannot be read as an option: after a literal "--", or
through `operand()` for a tool or position where "--" is not understood.
tests/test_project_rules.py scans every argv given to `run` for this.
A missing tool is a PermanentError (the host is not prepared), a timeout a
TemporaryError.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from host_reconciler import codes as host_codes
from schemas.errors import PermanentError, TemporaryError


@dataclass(frozen=True, slots=True)
class ToolResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def as_dict(self) -> dict[str, object]:
        return {
            "argv": list(self.argv),
            "rc": self.returncode,
            "stdout": self.stdout[-2000:],
            "stderr": self.stderr[-2000:],
        }


def operand(value: str | os.PathLike[str]) -> str:
    """`value` as an argv operand, refused if a program could read it as an option.

    For positions a literal "--" cannot protect: an option's argument, an
    operand of a tool without "--" (dhcp_release), a command argument of
    ovs-vsctl. An absolute path or a validated name always passes.
    """
    text = os.fspath(value)
    if not text or text.startswith("-") or "\x00" in text:
        raise PermanentError(f"refusing {text!r} as a command operand", code=host_codes.TOOL_ARGV)
    return text


def run(argv: Sequence[str], *, timeout: float = 600.0) -> ToolResult:
    if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
        raise PermanentError(f"refusing malformed argv {argv!r}", code=host_codes.TOOL_ARGV)
    try:
        proc = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as e:
        raise PermanentError(f"{argv[0]} is not installed on this host", code=host_codes.TOOL_MISSING) from e
    except subprocess.TimeoutExpired as e:
        raise TemporaryError(
            f"{argv[0]} did not finish in {timeout:.0f}s", code=host_codes.TOOL_TIMEOUT, delay=5.0
        ) from e
    return ToolResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
