"""`gpuaas bench ...`: benchmarks that print the figures issues ask for.

Each module in BENCH_MODULES exposes `register(bench_subparsers)`.
"""

from __future__ import annotations

import importlib
from typing import Any

BENCH_MODULES: tuple[str, ...] = (
    "reconciler.commands.bench_validate",
    "host_reconciler.discovery.bench",
    "reconciler.commands.bench_plan",
    "host_reconciler.bench",
    "reconciler.commands.bench_claims",
    "reconciler.commands.bench_gitops",
)


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks (plan, claims, validate)")
    bsub = p.add_subparsers(dest="bench_command", metavar="BENCH")
    bsub.required = True
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bsub)
