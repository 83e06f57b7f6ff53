"""`gpuaas bench ...`: benchmarks that print the figures issues ask for."""

from __future__ import annotations

from typing import Any

from gpuaas_tools.bench import (
    agents,
    applycold,
    baremetal,
    claims,
    console,
    gitops,
    leasekill,
    plan,
    portal,
    prplan,
    request,
    serve,
    telemetry,
    validate,
)
from gpuaas_tools.hostbench import discovery as discovery_bench
from gpuaas_tools.hostbench import host as host_bench
from gpuaas_tools.hostbench import ingress as ingress_bench
from reconciler import commands


def register(sub: Any) -> None:
    commands.register_group(
        sub,
        "bench",
        "benchmarks (validate, apply, plan, prplan, claims, gitops, discover, host, ingress, serve, agents, console, "
        "request, portal, baremetal, leasekill, telemetry)",
        (
            validate,
            applycold,
            discovery_bench,
            plan,
            host_bench,
            ingress_bench,
            claims,
            gitops,
            serve,
            prplan,
            agents,
            console,
            request,
            portal,
            baremetal,
            leasekill,
            telemetry,
        ),
    )
