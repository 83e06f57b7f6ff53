"""Subcommands of `gpuaas`; one module per group."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Command(Protocol):
    """A command module: adds its parser(s) to `gpuaas` or to a group."""

    def register(self, sub: Any) -> None: ...


def register_group(sub: Any, name: str, help_text: str, commands: Sequence[Command]) -> None:
    """Add `gpuaas NAME ...` whose subcommands come from `commands`."""
    p = sub.add_parser(name, help=help_text)
    gsub = p.add_subparsers(dest=f"{name}_command", metavar=name.upper() + "_COMMAND")
    gsub.required = True
    for command in commands:
        command.register(gsub)
