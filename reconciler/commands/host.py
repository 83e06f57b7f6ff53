"""`gpuaas host ...`: commands that run on a GPU host (discover, converge, run).

Each module in HOST_COMMAND_MODULES exposes `register(host_subparsers)`.
"""

from __future__ import annotations

import importlib
from typing import Any

HOST_COMMAND_MODULES: tuple[str, ...] = (
    "host_reconciler.discovery.cli",
    "host_reconciler.command",
)


def register(sub: Any) -> None:
    p = sub.add_parser("host", help="host-side commands: discover, converge, run")
    hsub = p.add_subparsers(dest="host_command", metavar="HOST_COMMAND")
    hsub.required = True
    for name in HOST_COMMAND_MODULES:
        importlib.import_module(name).register(hsub)
