"""Commands another distribution adds to `gpuaas`, found through the `gpuaas.commands` entry points.

The benchmarks, the demo and the labs ship apart from the product (the
gpuaas-tools distribution, the `gpuaas-reconciler[tools]` extra) so that no
product module imports them. A tool distribution declares each command it
adds as an entry point in the group `gpuaas.commands`: the name is the
command's path below `gpuaas` joined with dots (`bench`, `demo`,
`host.image.bench`), the value a `register(subparsers)` callable like every
command module's. The parser that owns the path (the top level, `host image`)
calls it; without the tools those commands are absent.

Both agents' command trees use it, hence here and not under reconciler/.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

from schemas import codes as schemas_codes
from schemas.errors import PermanentError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

GROUP = schemas_codes.GPUAAS_COMMANDS
# The top-level commands the tools add, known by name so that running one without the tools says what to install.
TOOL_COMMANDS = ("bench", "demo")
EXTRA = "gpuaas-reconciler[tools]"


@functools.cache
def _entry_points() -> dict[str, EntryPoint]:
    """Every registered tool command by its dotted path, read once: the scan reads every installed distribution."""
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def names(parent: str = "") -> tuple[str, ...]:
    """The tool commands directly under `gpuaas PARENT` (PARENT dotted, '' for the top level), sorted."""
    prefix = f"{parent}." if parent else ""
    below = (n.removeprefix(prefix) for n in _entry_points() if n.startswith(prefix))
    return tuple(sorted(n for n in below if n and "." not in n))


def register(sub: Any, parent: str = "", only: str | None = None) -> None:
    """Add the tool commands under `gpuaas PARENT` (all, or the one named `only`) to the subparsers `sub`.

    A tool that does not import (a broken or half-removed install) is left
    out of a listing with one line on stderr, so `gpuaas --help` and the
    product's own commands still work; running that very command is
    `cli.tool_unavailable`.
    """
    for name in names(parent):
        if only is not None and name != only:
            continue
        path = f"{parent}.{name}" if parent else name
        try:
            add = _entry_points()[path].load()
        except ImportError as e:
            message = f"`gpuaas {path.replace('.', ' ')}` ({_entry_points()[path].value}) does not import: {e}"
            if only is not None:
                raise PermanentError(
                    f"{message}; reinstall the tools: pip install '{EXTRA}'", code=schemas_codes.CLI_TOOL_UNAVAILABLE
                ) from e
            print(f"warning: {message}", file=sys.stderr)
            continue
        add(sub)
