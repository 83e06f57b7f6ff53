"""`gpuaas demo`: the main job `make demo` runs on the example fleet.

Each step prints a heading and its result, so an operator can read the demo
as the story of one reconciliation.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reconciler import sources, summary
from reconciler.errors import PermanentError


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the main job on an example fleet")
    p.add_argument("path", nargs="?", default=Path("examples/fleet"), type=Path)
    p.set_defaults(func=run)


def _heading(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)))


def run(args: argparse.Namespace) -> int:
    _heading(f"validate {args.path}")
    result = sources.load(args.path)
    for problem in result.problems:
        print(problem.render())
    if result.errors:
        raise PermanentError(f"{len(result.errors)} validation error(s) in {args.path}", code="demo.invalid")
    _heading("fleet summary")
    print(summary.render_text(summary.fleet_summary(result.state)))
    return 0
