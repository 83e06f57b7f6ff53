"""`gpuaas validate`: every problem at once, as FILE:LINE:COL: CODE: message."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from reconciler import exiting
from reconciler.caches import checkedtrees
from schemas import output, progress


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="validate a desired-state repo")
    p.add_argument("path", nargs="?", default=".", type=Path)
    p.add_argument("--rev", help="read the tree at this git revision (no checkout)")
    output.add_argument(p, "text")
    p.add_argument("--summary", action="store_true", help="also print the fleet summary")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state directory holding the blob cache (<DIR>/cache; default $GPUAAS_STATE_DIR, else "
        "${XDG_CACHE_HOME:-~/.cache}/gpuaas); never inside a git checkout",
    )
    checkedtrees.add_arguments(p)
    progress.add_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from desired.reading import loading
    from reconciler import sources
    from reconciler.reports import summary

    # The on-disk cache serves revisions (blob ids from git); a working tree is read and parsed as it is.
    with (
        loading.collector_paused(),
        progress.for_args(args, "validate") as shown,
        shown.phase("read, parse and check the tree"),
    ):
        result = (
            checkedtrees.open_reader(args).load(args.path, args.rev)
            if args.rev is not None
            else sources.load(args.path, args.rev)
        )
        exiting.skip_teardown()  # holds a tree's models: the console script need not free them
    errors, warnings = result.errors, result.warnings
    state = result.state
    counts = (
        f"{state.file_count} files, {len(state.nodes)} nodes, {len(state.slot_maps)} slot maps, "
        f"{len(state.skus)} SKUs, {len(state.images)} images, {len(state.allocations)} allocations"
    )
    if output.structured(args.output):
        doc: dict[str, Any] = {
            "valid": not errors,
            "revision": state.revision,
            "errors": [e.as_dict() for e in errors],
            "warnings": [w.as_dict() for w in warnings],
            "counts": {
                "files": state.file_count,
                "nodes": len(state.nodes),
                "slot_maps": len(state.slot_maps),
                "skus": len(state.skus),
                "images": len(state.images),
                "allocations": len(state.allocations),
            },
        }
        if args.summary and not errors:
            doc["summary"] = summary.fleet_summary(state)
        output.emit(doc, args.output)
        return 1 if errors else 0
    for problem in errors + warnings:
        print(problem.render(), file=sys.stdout if problem in warnings else sys.stderr)
    if errors:
        print(f"invalid: {len(errors)} error(s), {len(warnings)} warning(s) in {counts}", file=sys.stderr)
        return 1
    print(f"valid: {counts}; {len(warnings)} warning(s)")
    if args.summary:
        print()
        print(summary.render_text(summary.fleet_summary(state)))
    return 0
