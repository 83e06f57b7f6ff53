"""A provision that fetches its image: HTTP server on 127.0.0.1 -> cache -> qcow2 convert -> slot disk.

ImageServer  remote/guest.qcow2  (drops the first connection halfway)
    ▲ image_base_url
lab node-a:  alloc-1 slot 0, alloc-2 slot 1, both naming the same image
    image_fetch (once for both) -> image_verify -> disk_write (qemu-img convert -O raw, compare)
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from host_reconciler import converging
from host_reconciler.actions import Step
from host_reconciler.drivers import wiring
from host_reconciler.imageserver import Fault, ImageServer
from schemas import hostplans as hp
from tests.host.conftest import Lab

MiB = 1 << 20


def test_a_provision_fetches_its_image_once_resuming_a_dropped_download(lab: Lab, tmp_path: Path) -> None:
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img is not installed")
    served = tmp_path / "served"
    (served / "remote").mkdir(parents=True)
    guest = os.urandom(3 * MiB) + bytes(2 * MiB) + os.urandom(MiB)
    raw = tmp_path / "guest.raw"
    raw.write_bytes(guest)
    qcow2 = served / "remote" / "guest.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    digest = hashlib.sha256(qcow2.read_bytes()).hexdigest()
    image = hp.ImageRef("remote-guest", "remote/guest.qcow2", digest, "qcow2")
    one = dataclasses.replace(lab.vm("alloc-1", (0,)), image=image)
    two = dataclasses.replace(lab.vm("alloc-2", (1,)), image=image)
    with ImageServer(served) as srv:
        srv.faults["remote/guest.qcow2"] = Fault(drop_after=qcow2.stat().st_size // 2, times=1)
        s = lab.settings(image_base_url=f"http://127.0.0.1:{srv.port}/", image_cache_bytes=64 * MiB)
        c = converging.Converger(s, wiring.drivers(s))
        try:
            r = c.converge(lab.plan(1, vms=(one, two)))
        finally:
            c.drivers.close()
        assert not r.errors, r.errors
        statuses = [status for _path, _range, status in srv.stats.requests]
        assert statuses == [200, 206]  # one download for both VMs, resumed once
    done = {
        a.allocation_id: [str(x.step) for x, _ in r.executed if x.allocation_id == a.allocation_id] for a in (one, two)
    }
    assert str(Step.IMAGE_FETCH) in done["alloc-1"]
    for slot in (0, 1):
        assert lab.slot_disks[slot].backing.read_bytes()[: len(guest)] == guest
    cached = r.status.as_dict()["images"]["cached"]
    assert [(c["digest"], c["in_use"], c["evictable"]) for c in cached] == [(f"sha256:{digest}", True, False)]
    assert r.status.as_dict()["images"]["fetching"] == []
    vm1 = next(v for v in r.status.vms if v.allocation_id == "alloc-1")
    assert str(Step.IMAGE_FETCH) in vm1.phase_timings


def test_a_mismatching_download_fails_the_provision_for_good(lab: Lab, tmp_path: Path) -> None:
    served = tmp_path / "served"
    served.mkdir()
    (served / "img.raw").write_bytes(os.urandom(MiB))
    image = hp.ImageRef("img", "img.raw", "e" * 64, "raw")  # the catalog says other bytes
    vm = dataclasses.replace(lab.vm("alloc-1", (0,)), image=image)
    with ImageServer(served) as srv:
        s = lab.settings(image_base_url=srv.url(""))
        c = converging.Converger(s, wiring.drivers(s))
        try:
            r = c.converge(lab.plan(1, vms=(vm,)))
            again = c.converge(lab.plan(1, vms=(vm,)))
        finally:
            c.drivers.close()
    assert [(e.step, e.code, e.retry) for e in r.errors] == [("image_fetch", "host.image.digest_mismatch", False)]
    report = next(v for v in r.status.vms if v.allocation_id == "alloc-1")
    assert (report.state, report.phase) == ("failed", "image_fetch")
    assert again.planned == ()  # failed at this generation: not downloaded again
    cache = Path(lab.settings_doc["image_dir"])
    assert list((cache / "sha256").iterdir()) == [] and list((cache / "partial").iterdir()) == []
    assert lab.slot_disks[0].backing.read_bytes()[:MiB] == bytes(MiB)  # nothing written


def test_the_pass_evicts_down_to_the_budget_keeping_the_image_in_use(lab: Lab) -> None:
    s = lab.settings(image_cache_bytes=3 * MiB)
    cache_dir = Path(lab.settings_doc["image_dir"]) / "sha256"
    cache_dir.mkdir(parents=True)
    old = os.urandom(2 * MiB)
    old_hex = hashlib.sha256(old).hexdigest()
    (cache_dir / old_hex).write_bytes(old)
    os.utime(cache_dir / old_hex, (1.0, 1.0))  # used long ago
    vm = lab.vm("alloc-1", (0,))  # its 2 MiB image is fetched from the staged file
    c = converging.Converger(s, wiring.drivers(s))
    try:
        r = c.converge(lab.plan(1, vms=(vm,)))
    finally:
        c.drivers.close()
    assert not r.errors, r.errors
    assert sorted(p.name for p in cache_dir.iterdir()) == [lab.digest]  # the old one went, the used one stayed
    assert r.status.as_dict()["images"]["used_bytes"] == 2 * MiB


def test_a_catalog_pinned_image_stays_and_the_evict_command_keeps_it_too(lab: Lab) -> None:
    s = lab.settings(image_cache_bytes=3 * MiB)
    cache_dir = Path(lab.settings_doc["image_dir"]) / "sha256"
    cache_dir.mkdir(parents=True)
    olds = []
    for _ in range(2):
        data = os.urandom(2 * MiB)
        hexd = hashlib.sha256(data).hexdigest()
        (cache_dir / hexd).write_bytes(data)
        os.utime(cache_dir / hexd, (1.0, 1.0))  # both used long ago: LRU alone would evict both
        olds.append(hexd)
    pinned, _loose = olds
    c = converging.Converger(s, wiring.drivers(s))
    try:
        r = c.converge(lab.plan(1, pinned_images=(pinned,)))
    finally:
        c.drivers.close()
    assert not r.errors, r.errors
    assert sorted(p.name for p in cache_dir.iterdir()) == [pinned]  # over budget alone, the loose one went
    (entry,) = r.status.as_dict()["images"]["cached"]
    assert entry["pinned"] and not entry["evictable"]
    assert c.state.read_image_pins() == {pinned}  # what `gpuaas host image evict` keeps besides settings pins
