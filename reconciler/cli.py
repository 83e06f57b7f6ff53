"""`gpuaas`: one console script, one module per subcommand group.

Each module in COMMAND_MODULES exposes `register(subparsers)` and sets
`func` on its parsers. Errors the user can cause are GpuaasError subclasses
and print as `error: CODE: message` with exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from reconciler.errors import GpuaasError

COMMAND_MODULES = (
    "reconciler.commands.validate",
    "reconciler.commands.schema",
    "reconciler.commands.request",
    "reconciler.commands.demo",
    "reconciler.commands.host",
    "reconciler.commands.bench",
    "reconciler.commands.drift",
    "reconciler.commands.fleet",
    "reconciler.commands.simulate",
    "reconciler.commands.plan",
    "reconciler.commands.status",
    "reconciler.commands.run",
    "reconciler.commands.history",
    "reconciler.commands.db",
    "reconciler.commands.apply",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuaas", description="GitOps reconciler for a GPU cloud")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except GpuaasError as e:
        print(f"error: {e.code}: {e.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
    except BrokenPipeError:
        return 0
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
