"""Subcommands of `gpuaas`; one module per group."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any


def register_group(sub: Any, name: str, help_text: str, modules: Sequence[str]) -> None:
    """Add `gpuaas NAME ...` whose subcommands come from `modules` (each has `register(subparsers)`)."""
    p = sub.add_parser(name, help=help_text)
    gsub = p.add_subparsers(dest=f"{name}_command", metavar=name.upper() + "_COMMAND")
    gsub.required = True
    for module in modules:
        importlib.import_module(module).register(gsub)
