"""`gpuaas bench host`: the host reconciler's figures on a lab host (root, loop devices, netns).

converge_1gpu_ms    one 1-GPU slice from nothing to active, excluding the disk copy
                    (disk_write) and guest boot (readiness): median of --runs
drift_scan_8slot_ms a report-only pass over an 8-slot host with 4 VMs on 7 slots and one
                    free slot (observe everything + diff + drift + status): median
drift_pure_8slot_ms the pure diff + drift on that host's observation: median
release_1gpu_phase_ms  median ms of each release step of that slice (slot_health: the slot's
                    GPU + VF reset and identity proof, through the lab's PCI driver)
wipe_verify_1gib_ms wipe (wipefs, blkdiscard) + verify (blkid -p, sampled reads) of a
                    --wipe-gib GiB loop disk holding an ext4 with data
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import hostplans as hp

if TYPE_CHECKING:
    from gpuaas_tools.lab import host as lab
    from host_reconciler import converging


NET = hp.Network("10.100.0.0/24", "10.100.0.1", "10.100.0.10", "10.100.0.250", "gpuaasbr0")
GPUS = ("1b", "3c", "4b", "5c", "9a", "ba", "ca", "db")


def register(sub: Any) -> None:
    p = sub.add_parser("host", help="host reconciler: converge, drift scan, wipe + verify (needs root)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--wipe-gib", type=int, default=1)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _slots() -> tuple[hp.SlotBundle, ...]:
    return tuple(
        hp.SlotBundle(
            i,
            f"0000:{g}:00.0",
            f"0000:{int(g, 16) - 1:02x}:00.1",
            f"/dev/disk/by-id/nvme-BENCH-S{i}",
            f"52:54:00:be:00:{i:02x}",
            f"10.100.0.{10 + i}",
            0 if i < 4 else 1,
        )
        for i, g in enumerate(GPUS)
    )


def _vm(alloc: str, slots: tuple[hp.SlotBundle, ...], image: hp.ImageRef, vcpus: int) -> hp.VmSpec:
    return hp.VmSpec(alloc, "bench", slots, vcpu_count=vcpus, memory_mib=4096 * len(slots), image=image)


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 1) if xs else 0.0


def run(args: argparse.Namespace) -> int:
    from gpuaas_tools.lab import host as lab
    from host_reconciler import converging
    from host_reconciler.drivers import wiring

    lab.check_host()
    slots = _slots()
    out: dict[str, Any] = {"runs": args.runs}
    with (
        tempfile.TemporaryDirectory(prefix="gpuaas-bench-", dir="/tmp") as tmp,
        lab.lab_host(
            "bench-node",
            Path(tmp) / "node",
            disk_paths=[s.nvme_device for s in slots],
            os_disk="/dev/disk/by-id/nvme-BENCH-OS",
        ) as host,
    ):
        digest = lab.publish_image(host.image_dir, "bench/image.raw", 1 << 20)
        image = hp.ImageRef("bench", "bench/image.raw", digest, "raw")
        ids = _identities(host, slots)
        s = host.settings()
        drivers = wiring.drivers(s)
        conv = converging.Converger(s, drivers)
        try:
            out.update(_converge(conv, slots, ids, image, args.runs))
            out.update(_drift(conv, slots, ids, image, args.runs))
        finally:
            drivers.close()
        out.update(_wipe(host, args.wipe_gib))
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:32s} {v}")
    return 0


def _identities(host: lab.LabHost, slots: tuple[hp.SlotBundle, ...]) -> tuple[hp.SlotIdentity, ...]:
    """Each slot disk's identity as discovery records it in the approval (a plan without one writes nothing)."""
    from host_reconciler.drivers import disks, protocols

    d = disks.BlockDisks(protocols.DiskSettings(by_id_root=host.by_id_root))
    return tuple(hp.SlotIdentity(s.slot_index, d.identity_of(s.nvme_device)) for s in slots)


def _plan(gen: int, slots: tuple[hp.SlotBundle, ...], ids: tuple[hp.SlotIdentity, ...], **kw: Any) -> hp.HostPlan:
    return hp.HostPlan(
        "bench-node",
        gen,
        NET,
        "/dev/disk/by-id/nvme-BENCH-OS",
        slots=slots,
        shutdown_timeout_s=5,
        disk_identities=ids,
        **kw,
    )


def _converge(
    conv: converging.Converger,
    slots: tuple[hp.SlotBundle, ...],
    ids: tuple[hp.SlotIdentity, ...],
    image: hp.ImageRef,
    runs: int,
) -> dict[str, Any]:
    from host_reconciler.actions import Step

    gen = 0
    first = None
    totals: list[float] = []
    excl: list[float] = []
    phases: dict[str, list[float]] = {}
    released: dict[str, list[float]] = {}
    for i in range(runs + 1):
        vm = _vm(f"bench-{i}", (slots[0],), image, 24)
        gen += 1
        t0 = time.perf_counter()
        r = conv.converge(_plan(gen, slots, ids, vms=(vm,)))
        wall = (time.perf_counter() - t0) * 1000
        assert not r.errors, r.errors  # noqa: S101 -- a bench on a broken lab says nothing
        skipped = sum(ms for a, ms in r.executed if a.step in (Step.DISK_WRITE, Step.READINESS))
        if i == 0:
            first = round(wall - skipped, 1)  # also creates the bridge, NAT rules and dnsmasq
        else:
            totals.append(wall)
            excl.append(wall - skipped)
            for a, ms in r.executed:
                phases.setdefault(str(a.step), []).append(ms)
        gen += 1
        rel = conv.converge(_plan(gen, slots, ids, releases=(vm,)))
        if i > 0:  # wipe, verify, slot_health (reset + identity proof of the GPU and VF), report_free
            for a, ms in rel.executed:
                released.setdefault(str(a.step), []).append(ms)
    return {
        "converge_1gpu_first_pass_ms": first,
        "converge_1gpu_ms": _median(excl),
        "converge_1gpu_with_disk_copy_ms": _median(totals),
        "converge_1gpu_phase_ms": {k: _median(v) for k, v in phases.items()},
        "release_1gpu_phase_ms": {k: round(statistics.median(v), 3) for k, v in released.items()},
    }


def _drift(
    conv: converging.Converger,
    slots: tuple[hp.SlotBundle, ...],
    ids: tuple[hp.SlotIdentity, ...],
    image: hp.ImageRef,
    runs: int,
) -> dict[str, Any]:
    from host_reconciler import diff

    vms = (
        _vm("drift-a", (slots[0],), image, 8),
        _vm("drift-b", (slots[2], slots[3]), image, 16),
        _vm("drift-c", slots[4:8], image, 64),
    )
    plan = _plan(1000, slots, ids, vms=vms)
    r = conv.converge(plan)
    assert not r.errors, r.errors  # noqa: S101
    scans: list[float] = []
    pure: list[float] = []
    for _ in range(runs):
        t0 = time.perf_counter()
        res = conv.converge(plan)
        scans.append((time.perf_counter() - t0) * 1000)
        assert not res.executed  # noqa: S101 -- a scan, nothing to do
        opts = conv.context(plan).options()
        t1 = time.perf_counter()
        diff.diff(plan, res.observed, options=opts)
        diff.drift(plan, res.observed, options=opts)
        pure.append((time.perf_counter() - t1) * 1000)
    return {"drift_scan_8slot_ms": _median(scans), "drift_pure_8slot_ms": round(statistics.median(pure), 3)}


def _wipe(host: lab.LabHost, gib: int) -> dict[str, Any]:
    from host_reconciler.drivers import disks, protocols

    by_id = f"/dev/disk/by-id/nvme-BENCH-WIPE{gib}G"
    dev = host.add_disk(by_id, gib << 10, fs="ext4")
    with open(dev, "r+b") as f:  # data spread over the disk, as a tenant leaves it
        for k in range(16):
            f.seek(((gib << 30) // 16) * k + (1 << 20))
            f.write(os.urandom(1 << 20))
        os.fsync(f.fileno())
    d = disks.BlockDisks(protocols.DiskSettings(by_id_root=host.by_id_root, sample_count=64))
    # Approved as discovery would record it: the loop device just made (backing file, size).
    target = protocols.SlotDisk(99, by_id, by_id, "/dev/disk/by-id/nvme-BENCH-OS", d.identity_of(by_id))
    t0 = time.perf_counter()
    wiped = d.wipe(target)
    t1 = time.perf_counter()
    ev = d.verify(target)
    t2 = time.perf_counter()
    return {
        "wipe_verify_disk_gib": gib,
        "wipe_ms": round((t1 - t0) * 1000, 1),
        "verify_ms": round((t2 - t1) * 1000, 1),
        "wipe_verify_1gib_ms": round((t2 - t0) * 1000, 1),
        "wipe_method": wiped["method"],
        "verified": ev["verified"],
    }
