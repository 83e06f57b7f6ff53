"""`gpuaas`: one console script, one module per subcommand group.

Each module `commands()` lists exposes `register(subparsers)` and sets `func` on
its parsers. Command modules import only what building their parser needs
(argparse, the standard library, light project modules); the heavy libraries
(networkx, psycopg, gitpython, libvirt, pyroute2, ruamel, pydantic) are
imported inside the command that runs, so `gpuaas validate --help` on a CI
runner or `gpuaas host run` on a GPU host pays only for what it uses
(tests/test_light_cli.py). Errors the user can cause are GpuaasError subclasses
and print as `error: CODE: message` with exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any

from schemas import signals
from schemas.errors import GpuaasError


def commands() -> tuple[Any, ...]:
    """The command modules, in the order `gpuaas --help` shows them.

    Imported here, not at the top: `main` installs its SIGTERM handling
    before any command module loads, so a stop during start-up is clean.
    """
    from reconciler.bench import command as bench
    from reconciler.commands import (
        apply,
        completion,
        db,
        demo,
        drift,
        explain,
        fleet,
        history,
        host,
        plan,
        request,
        run,
        schema,
        serve,
        simulate,
        slot,
        status,
        usage,
        validate,
    )

    return (validate, schema, explain, request, demo, host, bench, drift, fleet, simulate, plan, status, run,
            history, db, apply, serve, usage, slot, completion)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuaas", description="GitOps reconciler for a GPU cloud")
    parser.add_argument("--version", action="version", version=f"gpuaas {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in commands():
        command.register(sub)
    return parser


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
            parser = build_parser()
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
