"""`gpuaas`: one console script, one module per subcommand group.

Each module `commands()` lists exposes `register(subparsers)` and sets `func` on
its parsers. Command modules import only what building their parser needs
(argparse, the standard library, light project modules); the heavy libraries
(networkx, psycopg, gitpython, libvirt, pyroute2, ruamel, pydantic) are
imported inside the command that runs, so `gpuaas validate --help` on a CI
runner or `gpuaas host run` on a GPU host pays only for what it uses
(tests/test_light_cli.py). Errors the user can cause are GpuaasError subclasses
and print as `error: CODE: message` with exit status 1, never a traceback.

The tools (`gpuaas bench ...`, `gpuaas demo`) are another distribution,
gpuaas-tools; their commands arrive through entry points (schemas/plugins.py)
and no product module imports them.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence
from typing import Any

from reconciler import codes as reconciler_codes
from reconciler import parsing
from schemas import plugins, signals
from schemas.errors import GpuaasError, UsageError

# The product's command groups, in the order `gpuaas --help` shows them (the tools' come after);
# each is the module under reconciler/commands/ that registers it.
NAMES = (
    "validate",
    "schema",
    "explain",
    "request",
    "host",
    "drift",
    "fleet",
    "simulate",
    "plan",
    "status",
    "get",
    "describe",
    "run",
    "history",
    "db",
    "apply",
    "serve",
    "tenant",
    "usage",
    "slot",
    "machine",
    "completion",
)


def command(name: str) -> Any:
    """The module that registers `gpuaas NAME`."""
    return importlib.import_module(f"reconciler.commands.{name}")


def commands() -> tuple[Any, ...]:
    """The command modules, in the order `gpuaas --help` shows them.

    Imported here, not at the top: `main` installs its SIGTERM handling
    before any command module loads, so a stop during start-up is clean.
    """
    return tuple(command(name) for name in NAMES)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; for `argv` that starts with a command name, that command's alone.

    Importing every command module and what its parser needs would be
    paid by each `gpuaas plan` in CI for commands it does not run. The
    parser of one command parses its arguments as the whole one does; any
    other argv (`--help`, `--version`, a typo) gets the whole parser.
    """
    parser = parsing.Parser(prog="gpuaas", description="GitOps reconciler for a GPU cloud")
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    first = argv[0] if argv else None
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    if first in NAMES:
        command(first).register(sub)
    elif first is not None and first in plugins.names():
        plugins.register(sub, only=first)
    elif first in plugins.TOOL_COMMANDS:
        raise UsageError(
            f"`gpuaas {first}` comes with the tools, which are not installed: pip install '{plugins.EXTRA}' "
            "(from a checkout: pip install -e tools)",
            code=reconciler_codes.CLI_TOOLS_MISSING,
        )
    else:
        for module in commands():
            module.register(sub)
        plugins.register(sub)
    return parser


class _Version(argparse.Action):
    """`--version`, looked up only when asked for (importing importlib.metadata is not free)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        print(f"gpuaas {_version()}")
        parser.exit()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("gpuaas-reconciler")
    except metadata.PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    # Until a command installs its own handling (the loops stop cleanly on SIGTERM),
    # SIGTERM unwinds like an exception: open transactions roll back, nothing half-done.
    started = False
    try:
        with signals.sigterm_raises():
            argv = list(sys.argv[1:] if argv is None else argv)
            parser = build_parser(argv)
            args = parser.parse_args(argv)
            started = True
            status = args.func(args)
    except signals.Terminated:
        return 128 + signal.SIGTERM if started else 0  # before the command started nothing happened
    except GpuaasError as e:
        print(f"error: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:
        return 0
    return int(status or 0)


def entry() -> None:
    """The `gpuaas` console script."""
    from reconciler import exiting

    exiting.script()
    exiting.finish(main())


if __name__ == "__main__":
    entry()
