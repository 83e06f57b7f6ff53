"""`gpuaas bench ...`: benchmarks that print the figures issues ask for."""

from __future__ import annotations

from typing import Any

from host_reconciler.bench import discovery as discovery_bench
from host_reconciler.bench import host as host_bench
from reconciler import commands
from reconciler.commands import bench_claims, bench_gitops, bench_plan, bench_serve, bench_validate


def register(sub: Any) -> None:
    commands.register_group(sub, "bench", "benchmarks (validate, plan, claims, gitops, discover, host)",
                            (bench_validate, discovery_bench, bench_plan, host_bench, bench_claims, bench_gitops,
                             bench_serve))
