"""`/proc/self/mountinfo`, parsed one way for the disk guard and for discovery."""

from __future__ import annotations

import re
from dataclasses import dataclass

_OCTAL = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, newline and backslash as \ooo


@dataclass(frozen=True, slots=True)
class Mount:
    majmin: str
    mount_point: str
    source: str


def parse_mountinfo(text: str) -> list[Mount]:
    """Every mount of `text`, in order; a line without the ` - ` separator is skipped."""
    out: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        f = left.split()
        if not sep or len(f) < 5:
            continue
        r = right.split()
        out.append(Mount(f[2], _unescape(f[4]), _unescape(r[1]) if len(r) > 1 else ""))
    return out


def _unescape(s: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), s)
