"""`gpuaas host ...`: commands that run on a GPU host (discover, converge, run, bootstrap).

The only place the central reconciler's CLI reaches into the host agent.
"""

from __future__ import annotations

from typing import Any

from host_reconciler import bootstrapcommand as bootstrap_cli
from host_reconciler import command as host_command
from host_reconciler import discoverycommand as discovery_cli
from reconciler import commands
from reconciler.commands import hosttoken


def register(sub: Any) -> None:
    commands.register_group(
        sub,
        "host",
        "host-side commands: discover, converge, run, bootstrap, token",
        (discovery_cli, host_command, bootstrap_cli, hosttoken),
    )
