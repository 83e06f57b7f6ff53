"""The disk guard checks the approved disk identity in sysfs before every write, wipe and verify.

    approved: slot 0 = by-id/nvme-A, identity {backing_file: <A.img>, size_bytes: 16 MiB}

    by-id/nvme-A -> /dev/loopX (A)             check, wipe, verify: allowed
    by-id/nvme-A -> /dev/loopY (B, ext4)       refused: host.disk.identity_changed; B keeps its ext4

A loop device is known by its backing file and size, an NVMe namespace by its
controller's model and serial, its wwid and size (read here from a recorded
XE9680L tree, and compared with what discovery records for the approval).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from host_reconciler import converging, images, statuses
from host_reconciler import settings as hs
from host_reconciler.actions import DriftCode
from host_reconciler.discovery import candidates, discovering
from host_reconciler.drivers import diskidentity, disks, protocols, wiring
from policies import eligibility
from reconciler import sources
from reconciler.store import connections, hostplans, inventory
from schemas import hostplans as hp
from schemas.states import SlotStatus
from tests.discovery.conftest import load_build
from tests.host.conftest import Lab, Loop, Loops
from tests.placement import pictures

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet"
MiB = 1 << 20


def driver(loops: Loops) -> disks.BlockDisks:
    return disks.BlockDisks(protocols.DiskSettings(by_id_root=loops.by_id_root, sample_count=16))


def identity_of(loop: Loop, size_mb: int = 16) -> hp.DiskIdentity:
    """What an approval of `loop` records: its backing file and size."""
    return hp.DiskIdentity(size_bytes=size_mb * MiB, backing_file=os.path.realpath(loop.backing))


def repoint(loops: Loops, name: str, target: Loop) -> None:
    """udev (or a person) makes by-id/NAME lead to another block device."""
    link = loops.by_id_root / name
    link.unlink()
    link.symlink_to(target.device)


def blkid_type(dev: str) -> str:
    res = subprocess.run(["blkid", "-p", "-o", "export", dev], capture_output=True, text=True, check=False)
    return dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line).get("TYPE", "")


# -- the driver -----------------------------------------------------------------------------


def test_a_loop_device_is_known_by_its_backing_file_and_size(loops: Loops) -> None:
    a = loops.make("nvme-A", 16)
    seen = driver(loops).identity_of(a.by_id)
    assert seen == hp.DiskIdentity(size_bytes=16 * MiB, backing_file=os.path.realpath(a.backing))
    assert identity_of(a).differences(seen) == []


def test_a_repointed_link_is_refused_and_the_other_disk_is_untouched(loops: Loops) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    a = loops.make("nvme-A", 16, fs="ext4")
    b = loops.make("nvme-B", 16, fs="ext4")  # another tenant's disk, or anything else
    d = driver(loops)
    approved = protocols.SlotDisk(0, a.by_id, a.by_id, os_disk.by_id, identity_of(a))
    d.check(approved)  # the link leads to the approved disk: allowed

    repoint(loops, "nvme-A", b)
    before = b.sha256()
    for call in (d.wipe, d.verify, d.check):
        with pytest.raises(protocols.IdentityChanged) as e:
            call(approved)
        assert e.value.code == "host.disk.identity_changed"
        assert e.value.evidence["device"] == a.by_id and e.value.evidence["resolved"] == b.device
        assert e.value.evidence["identity"] == {
            "differs": ["backing_file"],
            "approved": identity_of(a).as_dict(),
            "observed": identity_of(b).as_dict(),
        }
    assert blkid_type(b.device) == "ext4"
    assert b.sha256() == before  # not one byte of B changed
    assert blkid_type(a.device) == "ext4"  # and A was never reached either


def test_the_image_write_is_refused_too(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    a = loops.make("nvme-A", 16)
    b = loops.make("nvme-B", 16, fs="ext4")
    repoint(loops, "nvme-A", b)
    img = tmp_path / "store" / "img.raw"
    img.parent.mkdir()
    img.write_bytes(os.urandom(MiB))
    digest = hashlib.sha256(img.read_bytes()).hexdigest()
    token = images.verify(images.resolve(tmp_path / "store", hp.ImageRef("x", "img.raw", digest, "raw")), digest)
    before = b.sha256()
    with pytest.raises(protocols.IdentityChanged):
        driver(loops).write_image(
            protocols.SlotDisk(0, a.by_id, a.by_id, os_disk.by_id, identity_of(a)),
            token,
            digest=digest,
            image_format="raw",
        )
    assert b.sha256() == before


def test_a_different_size_alone_is_refused(loops: Loops) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    a = loops.make("nvme-A", 16, fs="ext4")
    approved = dataclasses.replace(identity_of(a), size_bytes=32 * MiB)  # the approval saw a bigger disk
    with pytest.raises(protocols.IdentityChanged) as e:
        driver(loops).wipe(protocols.SlotDisk(0, a.by_id, a.by_id, os_disk.by_id, approved))
    assert e.value.evidence["identity"]["differs"] == ["size_bytes"]
    assert blkid_type(a.device) == "ext4"


def test_a_slot_whose_approval_records_no_identity_is_never_written(loops: Loops, tmp_path: Path) -> None:
    os_disk = loops.make("nvme-OS", fs="ext4")
    a = loops.make("nvme-A", 16, fs="ext4")
    d = driver(loops)
    unbound = protocols.SlotDisk(0, a.by_id, a.by_id, os_disk.by_id, identity=None)
    img = tmp_path / "store" / "img.raw"
    img.parent.mkdir()
    img.write_bytes(os.urandom(MiB))
    digest = hashlib.sha256(img.read_bytes()).hexdigest()
    token = images.verify(images.resolve(tmp_path / "store", hp.ImageRef("x", "img.raw", digest, "raw")), digest)
    before = a.sha256()

    def write(disk: protocols.SlotDisk) -> object:
        return d.write_image(disk, token, digest=digest, image_format="raw")

    for call in (d.wipe, d.verify, d.check, write):
        with pytest.raises(protocols.IdentityMissing) as e:
            call(unbound)
        assert e.value.code == "host.disk.identity_missing"
        assert isinstance(e.value, protocols.IdentityChanged)  # blocks the slot the same way
        assert e.value.evidence["identity"]["approved"] is None
        assert e.value.evidence["identity"]["observed"] == identity_of(a).as_dict()
    assert a.sha256() == before and blkid_type(a.device) == "ext4"
    d.check(dataclasses.replace(unbound, identity=identity_of(a)))  # the same disk, once its identity is approved


def test_identity_is_kept_only_for_the_approved_disk() -> None:
    ident = hp.DiskIdentity(size_bytes=512, serial="S1")
    approved = [(0, "/dev/disk/by-id/nvme-S0")]
    os_disk = "/dev/disk/by-id/nvme-OS"
    assert protocols.slot_disk(0, "/dev/disk/by-id/nvme-S0", approved, os_disk, ident).identity == ident
    assert protocols.slot_disk(0, "/dev/disk/by-id/nvme-S9", approved, os_disk, ident).identity is None


@pytest.fixture(scope="module")
def h200_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = load_build()
    root = tmp_path_factory.mktemp("sysfs") / "xe9680l-h200"
    build.build(next(h for h in build.hosts() if h.dirname == "xe9680l-h200"), root)
    return root


def test_nvme_identity_is_read_from_a_recorded_sysfs_tree(h200_tree: Path) -> None:
    sys_root = h200_tree / "sys"
    majmin = (sys_root / "block" / "nvme0n1" / "dev").read_text().strip()
    assert diskidentity.read_identity(sys_root, majmin) == hp.DiskIdentity(
        size_bytes=7501476528 * 512,
        model="SAMSUNG MZWLR3T8HBLS-00007",
        serial="S6EXNA0W100",
        wwid="eui.0025388500001c0a",
    )
    # The OS disk's partition has no controller: a partition is never an approved namespace.
    part = (sys_root / "block" / "nvme4n1" / "nvme4n1p2" / "dev").read_text().strip()
    assert diskidentity.read_identity(sys_root, part).serial is None


def test_the_host_reads_what_discovery_records_for_every_namespace(h200_tree: Path) -> None:
    """An approval made from `gpuaas host discover` matches the host it was made on, field for field."""
    found = discovering.discover(h200_tree)
    assert len(found.nvme) == 9
    for ns in found.nvme:
        recorded = candidates.nvme_identity(ns)
        assert recorded is not None
        majmin = (h200_tree / "sys" / "block" / ns.name / "dev").read_text().strip()
        seen = diskidentity.read_identity(h200_tree / "sys", majmin)
        approved = hp.DiskIdentity.from_dict(recorded)
        assert approved is not None and approved.differences(seen) == []
        assert seen.as_dict() == recorded


# -- the host plan --------------------------------------------------------------------------


def test_the_plan_codec_keeps_the_identity_optional() -> None:
    b = hp.SlotBundle(0, "0000:1b:00.0", None, "/dev/disk/by-id/nvme-S0", "52:54:00:00:00:01", "10.100.0.10", 0)
    net = hp.Network("10.100.0.0/24", "10.100.0.1", "10.100.0.10", "10.100.0.250", "gpuaasbr0")
    plain = hp.HostPlan("n", 1, net, "/dev/disk/by-id/nvme-OS", slots=(b,))
    doc = hp.to_json(plain)
    assert "disk_identities" not in doc  # an older host reads it; an older writer's spec is the same
    assert hp.from_json(json.loads(json.dumps(doc))) == plain
    ident = hp.DiskIdentity(size_bytes=4096, model="M", serial="S", wwid="eui.01")
    with_id = dataclasses.replace(plain, disk_identities=(hp.SlotIdentity(0, ident),))
    doc = hp.to_json(with_id)
    assert doc["disk_identities"] == [
        {"slot_index": 0, "nvme_identity": {"size_bytes": 4096, "model": "M", "serial": "S", "wwid": "eui.01"}}
    ]
    back = hp.from_json(json.loads(json.dumps(doc)))
    assert back == with_id and back.nvme_identity(0) == ident and back.nvme_identity(1) is None


def test_identity_travels_from_the_slot_map_to_the_host_plan(db_url: str) -> None:
    state = sources.load(FLEET).state
    with connections.connect(db_url) as conn:
        inventory.sync(conn, state)
        hostplans.write(conn, ["h200-use1-c01", "h200-use1-s01"])
        c01 = hostplans.read(conn, "h200-use1-c01")
        s01 = hostplans.read(conn, "h200-use1-s01")
        stored = conn.execute(
            "SELECT s.nvme_identity FROM node_resource_slots s JOIN nodes n ON n.id = s.node_id"
            " WHERE n.name = 'h200-use1-c01' AND s.slot_index = 0"
        ).fetchone()
        raw = conn.execute("SELECT spec FROM host_plans WHERE node_name = 'h200-use1-s01'").fetchone()
        again = inventory.sync(conn, state)
        rewritten = hostplans.write(conn, ["h200-use1-c01", "h200-use1-s01"])
    assert c01 is not None and s01 is not None and stored is not None and raw is not None
    assert stored[0] == {
        "model": "SAMSUNG MZWLR3T8HBLS-00007",
        "serial": "S6EXNA0W400",
        "wwid": "eui.0025388500001c0a",
        "size_bytes": 3840755982336,
    }
    approved = state.slot_maps["h200-use1-c01"].slots
    assert [(i.slot_index, i.nvme_identity.serial) for i in c01.disk_identities] == [
        (s.slot_index, s.nvme_identity.serial if s.nvme_identity else None) for s in approved
    ]
    assert c01.nvme_identity(0) == hp.DiskIdentity.from_dict(stored[0])
    assert [i.slot_index for i in s01.disk_identities] == list(range(8))  # every example records it
    assert raw[0]["disk_identities"][0]["nvme_identity"]["serial"] == "S6EXNA0W100"
    assert not again.changed and not any(w.changed for w in rewritten)  # nothing churns


# -- settings -------------------------------------------------------------------------------


def test_the_discovery_gate_runs_by_default_where_sysfs_is(tmp_path: Path) -> None:
    real = Path("/sys/class/block").is_dir()
    assert hs.HostSettings(node="n").discovery_root == (Path("/") if real else None)
    assert hs.from_dict("n", {}).discovery_root == (Path("/") if real else None)
    assert hs.from_dict("n", {"discovery_root": "auto"}).discovery_root == (Path("/") if real else None)
    assert hs.from_dict("n", {"discovery_root": None}).discovery_root is None  # explicitly off
    assert hs.from_dict("n", {"pci": "fake-vfio"}).discovery_root is None  # a lab host has no GPUs to gate
    tree = tmp_path / "tree"
    (tree / "sys" / "class" / "block").mkdir(parents=True)
    assert hs.from_dict("n", {"sysfs_root": str(tree / "sys")}).discovery_root == tree
    assert hs.from_dict("n", {"discovery_root": str(tree)}).discovery_root == tree
    assert hs.from_dict("n", {"sysfs_root": str(tmp_path / "nothing")}).discovery_root is None
    s = hs.from_dict("n", {})
    assert hs.from_dict("n", hs.to_dict(s)) == s


# -- a host pass ----------------------------------------------------------------------------


def converger(lab: Lab) -> converging.Converger:
    s = lab.settings()
    return converging.Converger(s, wiring.drivers(s))


def approved_plan(
    lab: Lab, generation: int, *, vms: tuple[hp.VmSpec, ...] = (), releases: tuple[hp.VmSpec, ...] = ()
) -> hp.HostPlan:
    """The lab plan with every slot disk's identity approved (its loop device's backing file and size)."""
    ids = tuple(hp.SlotIdentity(i, identity_of(loop)) for i, loop in sorted(lab.slot_disks.items()))
    return lab.plan(generation, vms=vms, releases=releases, disk_identities=ids)


def slot(result: converging.PassResult, index: int) -> statuses.SlotReport:
    return next(s for s in result.status.slots if s.slot_index == index)


def test_release_refuses_to_wipe_a_repointed_disk_blocks_the_slot_and_reports_drift(lab: Lab) -> None:
    victim = lab.loops.make("nvme-VICTIM", 16, fs="ext4")
    vm = lab.vm("alloc-2", (2, 3), vcpus=4, memory_mib=2048)
    c = converger(lab)
    try:
        first = c.converge(approved_plan(lab, 1, vms=(vm,)))
        assert not first.errors, first.errors
        repoint(lab.loops, "nvme-S2", victim)  # slot 2's by-id link now leads to another disk
        before = victim.sha256()
        r = c.converge(approved_plan(lab, 2, releases=(vm,)))
        assert blkid_type(victim.device) == "ext4" and victim.sha256() == before
        assert [(e.step, e.code, e.slot_indexes) for e in r.errors] == [("wipe", "host.disk.identity_changed", (2,))]
        two, three = slot(r, 2), slot(r, 3)
        assert two.state is SlotStatus.CLEANUP_BLOCKED and not two.schedulable
        assert three.state is SlotStatus.AVAILABLE and three.schedulable
        assert two.wipe_evidence["identity"]["differs"] == ["backing_file"]
        (found,) = [d for d in r.status.drift if d.code is DriftCode.IDENTITY_CHANGED]
        assert found.slot_index == 2 and found.allocation_id == "alloc-2"
        assert found.expected == f"backing_file={os.path.realpath(lab.slot_disks[2].backing)}"
        assert found.observed == f"backing_file={os.path.realpath(victim.backing)}"
        assert "host.disk.identity_changed" in found.message
        # Every later pass leaves the slot alone and keeps reporting it.
        again = c.converge(approved_plan(lab, 2, releases=(vm,)))
        assert again.planned == () and not again.errors
        assert [d.slot_index for d in again.status.drift if d.code is DriftCode.IDENTITY_CHANGED] == [2]
        assert blkid_type(victim.device) == "ext4" and victim.sha256() == before
    finally:
        c.drivers.close()


def test_provisioning_refuses_a_repointed_disk_until_the_link_is_right_again(lab: Lab) -> None:
    victim = lab.loops.make("nvme-VICTIM", 16, fs="ext4")
    vm = lab.vm("alloc-1", (0,))
    c = converger(lab)
    try:
        repoint(lab.loops, "nvme-S0", victim)
        before = victim.sha256()
        r = c.converge(approved_plan(lab, 1, vms=(vm,)))
        assert [(e.step, e.code) for e in r.errors] == [("host_checks", "host.disk.identity_changed")]
        assert victim.sha256() == before and blkid_type(victim.device) == "ext4"
        assert slot(r, 0).state is SlotStatus.FAILED
        assert [d.slot_index for d in r.status.drift if d.code is DriftCode.IDENTITY_CHANGED] == [0]
        assert c.drivers.domains.domains() == {}

        repoint(lab.loops, "nvme-S0", lab.slot_disks[0])  # the operator fixes the link
        r = c.converge(approved_plan(lab, 2, vms=(vm,)))  # a new generation retries
        assert not r.errors, r.errors
        assert slot(r, 0).state is SlotStatus.ACTIVE
        assert not [d for d in r.status.drift if d.code is DriftCode.IDENTITY_CHANGED]
        assert lab.slot_disks[0].backing.read_bytes()[:12] == lab.image.read_bytes()[:12]
        assert victim.sha256() == before
    finally:
        c.drivers.close()


def test_provisioning_refuses_a_slot_without_a_recorded_identity_until_git_approves_one(lab: Lab) -> None:
    vm = lab.vm("alloc-1", (0,))
    c = converger(lab)
    try:
        before = lab.slot_disks[0].sha256()
        r = c.converge(lab.plan(1, vms=(vm,), disk_identities=()))  # an approval that names the disk only
        assert [(e.step, e.code) for e in r.errors] == [("host_checks", "host.disk.identity_missing")]
        assert lab.slot_disks[0].sha256() == before
        assert slot(r, 0).state is SlotStatus.FAILED
        (found,) = [d for d in r.status.drift if d.code is DriftCode.IDENTITY_CHANGED]
        assert found.slot_index == 0 and "host.disk.identity_missing" in found.message
        assert c.drivers.domains.domains() == {}

        r = c.converge(approved_plan(lab, 2, vms=(vm,)))  # git records the identity: a new generation
        assert not r.errors, r.errors
        assert slot(r, 0).state is SlotStatus.ACTIVE
        assert not [d for d in r.status.drift if d.code is DriftCode.IDENTITY_CHANGED]
    finally:
        c.drivers.close()


# -- the central side -----------------------------------------------------------------------


def without_identity(fleet: Path, node: str, slots: set[int]) -> None:
    path = fleet / "slotmaps" / f"{node}.yaml"
    doc = yaml.safe_load(path.read_text())
    for s in doc["slots"]:
        if s["slot_index"] in slots:
            del s["nvme_identity"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_validate_warns_that_a_slot_without_a_recorded_identity_can_never_be_scheduled(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    shutil.copytree(FLEET, fleet)
    assert not [w for w in sources.load(fleet).warnings if "disk.identity_missing" in w.message]
    without_identity(fleet, "h200-use1-s01", {3})
    result = sources.load(fleet)
    (warning,) = [w for w in result.warnings if w.file == "slotmaps/h200-use1-s01.yaml"]
    assert warning.code == "desired.slot.unschedulable" and warning.severity.value == "warning"
    assert "slot 3 can never be scheduled (disk.identity_missing)" in warning.message
    reasons = eligibility.eligible_slots(result.state.slot_maps["h200-use1-s01"])
    assert [r.code for r in reasons[3]] == [eligibility.NO_DISK_IDENTITY]
    assert all(reasons[i] == [] for i in reasons if i != 3)


def test_the_planner_never_places_on_a_slot_without_a_recorded_identity() -> None:
    w = pictures.world("n1: [....|....]")
    smap = w.desired.slot_maps["n1"]
    bound = {6, 7}  # only these two slots record their disk's identity
    w.desired.slot_maps["n1"] = smap.model_copy(
        update={
            "slots": [s if s.slot_index in bound else s.model_copy(update={"nvme_identity": None}) for s in smap.slots]
        }
    )
    assert isinstance(w.place(pictures.SLICE, 4), str)  # pending: six of the eight slots are not sellable
    assert w.place(pictures.SLICE, 2) == ("n1", (6, 7))
