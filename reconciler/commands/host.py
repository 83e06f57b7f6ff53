"""`gpuaas host ...`: commands that run on a GPU host (discover, converge, run).

Each module in HOST_COMMAND_MODULES exposes `register(host_subparsers)`.
"""

from __future__ import annotations

from typing import Any

from reconciler import commands

HOST_COMMAND_MODULES: tuple[str, ...] = (
    "host_reconciler.discovery.cli",
    "host_reconciler.command",
)


def register(sub: Any) -> None:
    commands.register_group(sub, "host", "host-side commands: discover, converge, run", HOST_COMMAND_MODULES)
