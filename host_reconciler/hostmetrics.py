"""Gauges of the host's own report on the agent's /metrics (seed 003: onboarding state).

    gpuaas_host_agent_version_info{version}     1
    gpuaas_host_reboot_required                 1 when a reboot is needed (bootstrap staged, or the OS asks)
    gpuaas_host_firmware_ready                  1 / 0 from the firmware evidence; absent without evidence
    gpuaas_host_bootstrap_state{state}          1 for the recorded bootstrap state (never_run when none)
    gpuaas_host_guest_reports_refused{reason}   guest device reports and telemetry refused since start
                                                (bad_token, wrong_source, oversized, malformed, telemetry.*)

Kept apart from `metrics` so the pass counters and these gauges change independently.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.hostreports import HostReport


class HostReportGauges(Collector):
    def __init__(self) -> None:
        self.report: HostReport | None = None  # swapped whole after each pass
        self.refused: dict[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        refused = GaugeMetricFamily(
            "gpuaas_host_guest_reports_refused",
            "guest posts refused since the agent started, by reason",
            labels=["reason"],
        )
        for reason, n in sorted(self.refused.items()):
            refused.add_metric([reason], n)
        yield refused
        r = self.report
        if r is None:
            return
        info = GaugeMetricFamily("gpuaas_host_agent_version_info", "the host agent's version", labels=["version"])
        info.add_metric([r.agent_version], 1)
        yield info
        yield GaugeMetricFamily(
            "gpuaas_host_reboot_required",
            "1 when the host needs a reboot (reported, never done)",
            value=1 if r.reboot_required else 0,
        )
        if r.firmware_ready is not None:
            yield GaugeMetricFamily(
                "gpuaas_host_firmware_ready",
                "1 when the firmware evidence proves the profile",
                value=1 if r.firmware_ready else 0,
            )
        state = GaugeMetricFamily("gpuaas_host_bootstrap_state", "the recorded host bootstrap state", labels=["state"])
        state.add_metric([r.bootstrap_state], 1)
        yield state
