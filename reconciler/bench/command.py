"""`gpuaas bench ...`: benchmarks that print the figures issues ask for."""

from __future__ import annotations

from typing import Any

from host_reconciler.bench import discovery as discovery_bench
from host_reconciler.bench import host as host_bench
from host_reconciler.bench import ingress as ingress_bench
from reconciler import commands
from reconciler.bench import (
    agents,
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


def register(sub: Any) -> None:
    commands.register_group(
        sub,
        "bench",
        "benchmarks (validate, plan, prplan, claims, gitops, discover, host, ingress, serve, agents, console, request, "
        "portal, baremetal, leasekill, telemetry)",
        (
            validate,
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
