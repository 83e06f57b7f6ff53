"""`gpuaas bench ...`: benchmarks that print the figures issues ask for.

Each module in BENCH_MODULES exposes `register(bench_subparsers)`.
"""

from __future__ import annotations

from typing import Any

from reconciler import commands

BENCH_MODULES: tuple[str, ...] = (
    "reconciler.commands.bench_validate",
    "host_reconciler.discovery.bench",
    "reconciler.commands.bench_plan",
    "host_reconciler.bench",
    "reconciler.commands.bench_claims",
    "reconciler.commands.bench_gitops",
    "reconciler.commands.bench_serve",
)


def register(sub: Any) -> None:
    commands.register_group(sub, "bench", "benchmarks (validate, plan, claims, gitops, discover, host)", BENCH_MODULES)
