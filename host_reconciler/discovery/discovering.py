"""`discover(root) -> Discovery`: read one host's topology from a sysfs root.

Read-only and side-effect free apart from reading: the host reconciler calls
it on every pass (then `gating.gate`), and `gpuaas host discover` calls it
once (then `candidates.candidate_map`).
"""

from __future__ import annotations

import os

from host_reconciler.discovery import disks, facts, hosts, pci
from host_reconciler.discovery.sysfs import SysRoot


def discover(root: str | os.PathLike[str] = "/") -> facts.Discovery:
    """Everything discovery reports about the host under `root`.

    Raises PermanentError (`discovery.root.*`) when `root` is not a host root.
    """
    sr = SysRoot.open(root)
    reader = pci.PciReader(sr)
    disk_reader = disks.DiskReader(sr)
    kernel = sr.read("proc/sys/kernel/osrelease")
    cmdline = sr.read("proc/cmdline") or ""
    hugepages = hosts.read_hugepages(sr, "sys/kernel/mm/hugepages")
    return facts.Discovery(
        hostname=sr.read("proc/sys/kernel/hostname"),
        kernel=kernel,
        cmdline=cmdline,
        gpus=reader.gpus(),
        fabric=reader.fabric(),
        nvme=disk_reader.namespaces(),
        os_disks=disk_reader.os_disks(),
        numa_nodes=hosts.numa_nodes(sr),
        hugepages=hugepages,
        prerequisites=hosts.prerequisites(sr, kernel=kernel, cmdline=cmdline, hugepages=hugepages),
    )
