"""`gpuaas host bootstrap`: pure checks by table, --check on this machine, --apply in a throwaway root.

<root>/proc/{cmdline,cpuinfo,modules}, proc/sys/net/ipv4/ip_forward     read
<root>/etc/default/grub                                                 read, never written
<root>/etc/default/grub.d/90-gpuaas.cfg, etc/modules-load.d/..., etc/sysctl.d/...   managed
<root>/var/lib/gpuaas/bootstrap/state.json                              the result the agent reports
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from host_reconciler import bootstrapping as b
from host_reconciler import onboarding
from host_reconciler.drivers import hostroot
from reconciler import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sysfs" / "xe9680l-h200"
ALL_TOOLS = {t: True for t, _ in b.TOOLS}
PREPARED = b.Facts(
    cmdline=("ro", "intel_iommu=on", "iommu=pt"),
    cpu_vendor="GenuineIntel",
    kvm=True,
    tools=ALL_TOOLS,
    ovmf=True,
    grub_default='GRUB_CMDLINE_LINUX="intel_iommu=on iommu=pt"\n',
    files={b.MODULES_FILE: b._managed(b.VFIO_MODULES), b.SYSCTL_FILE: b._managed(["net.ipv4.ip_forward = 1"])},
    modules=frozenset(b.VFIO_MODULES),
    sysctl={"net.ipv4.ip_forward": "1"},
)


def _with(**kw: object) -> b.Facts:
    from dataclasses import replace

    return replace(PREPARED, **kw)  # type: ignore[arg-type]  # test table: field names checked by replace


@pytest.mark.parametrize(
    ("facts", "check", "outcome", "code"),
    [
        (PREPARED, "kernel_args", b.Outcome.OK, None),
        (_with(kvm=False), "virtualization", b.Outcome.BLOCKED, "host.bootstrap.kvm_missing"),
        (_with(ovmf=False), "virtualization", b.Outcome.CHANGE, None),
        (_with(cmdline=("ro",)), "kernel_args", b.Outcome.REBOOT, "host.bootstrap.reboot_required"),  # staged in grub
        (_with(cmdline=("ro",), grub_default='GRUB_CMDLINE_LINUX=""\n'), "kernel_args", b.Outcome.CHANGE, None),
        (
            _with(cmdline=("ro",), grub_default='GRUB_CMDLINE_LINUX="intel_iommu=off"\n'),
            "kernel_args",
            b.Outcome.BLOCKED,
            "host.bootstrap.grub_conflict",
        ),
        (_with(cmdline=("ro",), grub_default=None), "kernel_args", b.Outcome.BLOCKED, "host.bootstrap.grub_missing"),
        (_with(modules=frozenset()), "vfio_modules", b.Outcome.CHANGE, None),
        (
            _with(files={b.MODULES_FILE: "vfio\n# mine\n"}),
            "vfio_modules",
            b.Outcome.BLOCKED,
            "host.bootstrap.file_changed",
        ),
        (_with(sysctl={"net.ipv4.ip_forward": "0"}), "sysctl", b.Outcome.CHANGE, None),
        (
            _with(services={"nvidia-persistenced.service": b.ServiceState(enabled=True, active=None)}),
            "nvidia_services",
            b.Outcome.CHANGE,
            None,
        ),
        (_with(dir_modes={"/var/lib/gpuaas": 0o700}), "libvirt_permissions", b.Outcome.CHANGE, None),
        (_with(reservations=("vm-a", "vm-b"), domains=frozenset({"vm-a"})), "dnsmasq_cleanup", b.Outcome.CHANGE, None),
        (_with(reservations=("vm-a",), domains=None), "dnsmasq_cleanup", b.Outcome.OK, None),
    ],
)
def test_checks(facts: b.Facts, check: str, outcome: b.Outcome, code: str | None) -> None:
    found = {c.name: c for c in b.plan(facts, b.Options()).checks}[check]
    assert (found.outcome, found.code) == (outcome, code), found.detail


def test_a_prepared_host_needs_nothing_and_amd_gets_amd_iommu() -> None:
    p = b.plan(PREPARED, b.Options())
    assert (p.state, p.changes, p.reboot_required) == (b.State.READY, (), False)
    assert b.kernel_args(_with(cpu_vendor="AuthenticAMD"), b.Options(hugepages_1g=8)) == (
        "amd_iommu=on",
        "iommu=pt",
        "default_hugepagesz=1G",
        "hugepagesz=1G",
        "hugepages=8",
    )


def test_packages_install_in_one_change_placed_first() -> None:
    p = b.plan(_with(ovmf=False, tools={**ALL_TOOLS, "ovs-vsctl": False}, modules=frozenset()), b.Options())
    assert p.changes[0] == b.Change(b.ChangeKind.INSTALL, operands=("openvswitch-switch", "ovmf"))
    assert [c.kind for c in p.changes[1:]] == [b.ChangeKind.LOAD_MODULES]


def test_the_argv_run_is_the_one_check_lists() -> None:
    for change in (
        b.Change(b.ChangeKind.INSTALL, operands=("ovmf",)),
        b.Change(b.ChangeKind.UPDATE_GRUB),
        b.Change(b.ChangeKind.LOAD_MODULES, operands=b.VFIO_MODULES),
        b.Change(b.ChangeKind.RELOAD_SYSCTL),
        b.Change(b.ChangeKind.DISABLE_SERVICE, operands=("nvidia-persistenced.service",)),
    ):
        assert "run: " + " ".join(hostroot.HostRoot._argv(change)) == change.describe()


def _root(tmp_path: Path, *, grub: str | None = None) -> Path:
    """A throwaway host root: the recorded H200 tree's etc/ and proc/, without the IOMMU arguments running."""
    root = tmp_path / "root"
    shutil.copytree(EXAMPLE / "etc", root / "etc", symlinks=True)
    (root / "proc/sys/net/ipv4").mkdir(parents=True)
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro quiet\n")
    (root / "proc/cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n")
    (root / "proc/modules").write_text("kvm_intel 1 0 - Live 0x0\n")
    (root / "proc/sys/net/ipv4/ip_forward").write_text("0\n")
    (root / "dev").mkdir()
    (root / "dev/kvm").touch()
    for tool, _ in b.TOOLS:
        (root / "usr/bin").mkdir(parents=True, exist_ok=True)
        (root / "usr/bin" / tool).touch()
    (root / "usr/share/OVMF").mkdir(parents=True)
    (root / "usr/share/OVMF/OVMF_CODE.fd").touch()
    (root / "var/lib/gpuaas/host/dnsmasq/hosts").mkdir(parents=True)
    (root / "var/lib/gpuaas").chmod(0o700)
    if grub is not None:
        (root / "etc/default/grub").write_text(grub)
    return root


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    rc = cli.main(["host", "bootstrap", *argv, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_apply_in_a_throwaway_root_is_idempotent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _root(tmp_path, grub='GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX=""\n')
    grub_before = (root / "etc/default/grub").read_bytes()
    rc, check = _cli(capsys, "--check", "--root", str(root))
    assert rc == 3 and check["state"] == "changes_pending"
    assert not (root / "var/lib/gpuaas/bootstrap").exists()  # --check writes nothing, not even state
    rc, applied = _cli(capsys, "--apply", "--root", str(root))
    assert applied["planned"] == check["changes"]  # every change listed by --check, in order, and no other
    assert rc == 3 and applied["error"] is None
    assert (root / "etc/default/grub").read_bytes() == grub_before  # never edited
    dropin = (root / b.GRUB_DROPIN.lstrip("/")).read_text()
    assert 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX intel_iommu=on iommu=pt"' in dropin
    assert (root / b.MODULES_FILE.lstrip("/")).read_text().endswith("vfio\nvfio_iommu_type1\nvfio_pci\n")
    assert (root / "var/lib/gpuaas").stat().st_mode & 0o001
    deferred = [a for a in applied["applied"] if "deferred" in a]  # type: ignore[union-attr]
    assert [d["deferred"][0] for d in deferred] == ["update-grub", "modprobe", "sysctl"]
    state = json.loads((root / "var/lib/gpuaas/bootstrap/state.json").read_text())
    assert state["reboot_required"] is True and set(state["written"]) == {b.GRUB_DROPIN, b.MODULES_FILE, b.SYSCTL_FILE}
    # The commands' effects, as the live root would show them after the reboot.
    (root / "proc/cmdline").write_text("ro intel_iommu=on iommu=pt\n")
    (root / "proc/modules").write_text("".join(f"{m} 1 0 - Live 0x0\n" for m in b.VFIO_MODULES))
    (root / "proc/sys/net/ipv4/ip_forward").write_text("1\n")
    mtime = (root / b.MODULES_FILE.lstrip("/")).stat().st_mtime_ns
    rc, again = _cli(capsys, "--apply", "--root", str(root))
    assert (rc, again["state"], again["applied"], again["changes"]) == (0, "ready", [], [])
    assert (root / b.MODULES_FILE.lstrip("/")).stat().st_mtime_ns == mtime


def test_a_file_edited_after_bootstrap_is_reported_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(tmp_path, grub='GRUB_CMDLINE_LINUX="intel_iommu=on iommu=pt"\n')
    _cli(capsys, "--apply", "--root", str(root))
    edited = "# operator's own\nvfio\n"
    (root / b.MODULES_FILE.lstrip("/")).write_text(edited)
    rc, doc = _cli(capsys, "--apply", "--root", str(root))
    checks = {c["name"]: c for c in doc["checks"]}  # type: ignore[union-attr]
    assert rc == 3 and checks["vfio_modules"]["code"] == "host.bootstrap.file_changed"
    assert (root / b.MODULES_FILE.lstrip("/")).read_text() == edited


def test_grub_that_turns_iommu_off_is_reported_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grub = 'GRUB_CMDLINE_LINUX="quiet intel_iommu=off"\n'
    root = _root(tmp_path, grub=grub)
    rc, doc = _cli(capsys, "--apply", "--root", str(root))
    assert rc == 3 and doc["state"] == "blocked"
    assert (root / "etc/default/grub").read_text() == grub
    assert not (root / b.GRUB_DROPIN.lstrip("/")).exists()


def test_check_on_this_machine_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """Real /proc/cmdline, /proc/modules and /proc/sys of this machine; nothing is written."""
    managed = {p: Path(p).exists() for p in (b.GRUB_DROPIN, b.MODULES_FILE, b.SYSCTL_FILE)}
    rc, doc = _cli(capsys, "--check")
    assert rc in (0, 3)
    assert [c["name"] for c in doc["checks"]] == [
        fn.__name__.removeprefix("check_").replace(  # type: ignore[union-attr]
            "dnsmasq", "dnsmasq_cleanup"
        )
        for fn in b.CHECKS
    ]
    assert {p: Path(p).exists() for p in managed} == managed


def test_firmware_evidence(tmp_path: Path) -> None:
    d = tmp_path / "firmware-profile"
    assert onboarding.firmware(d)[:2] == (None, "host.firmware.no_evidence")  # the git claim stands
    d.mkdir()
    assert onboarding.firmware(d)[:2] == (False, "host.firmware.evidence_invalid")
    (d / "state.json").write_text("{not json")
    assert onboarding.firmware(d)[:2] == (False, "host.firmware.evidence_invalid")
    attrs = {a: "Enabled" for a in onboarding.SLICE_MINIMUM}
    doc = {
        "profile_tag": "gpuaas-profile-slice-vm",
        "profile_version": "h200-xe9680l-slice-vm-v1",
        "verified": True,
        "verified_at": "2026-04-17T10:00:00Z",
        "expected": {},
        "observed": attrs,
    }
    (d / "state.json").write_text(json.dumps(doc))
    ready, code, evidence = onboarding.firmware(d)
    assert (ready, code, evidence["profile_version"]) == (True, "host.firmware.ready", "h200-xe9680l-slice-vm-v1")
    (d / "state.json").write_text(json.dumps({**doc, "observed": {**attrs, "BIOS.ProcSettings.LogicalProc": "Off"}}))
    ready, code, evidence = onboarding.firmware(d)
    assert (ready, code, evidence["mismatched"]) == (
        False,
        "host.firmware.attribute_mismatch",
        ["BIOS.ProcSettings.LogicalProc"],
    )
    (d / "state.json").write_text(json.dumps({**doc, "verified": False}))
    assert onboarding.firmware(d)[:2] == (False, "host.firmware.not_verified")


def test_reboot_required_until_the_boot_id_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _root(tmp_path, grub='GRUB_CMDLINE_LINUX=""\n')
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    _cli(capsys, "--apply", "--root", str(root))
    state_dir = root / "var/lib/gpuaas/bootstrap"
    fw = root / "var/lib/gpuaas/firmware-profile"
    flag = root / "run/reboot-required"
    before = onboarding.report(fw, state_dir, reboot_flag=flag, boot="boot-1")
    assert before.reboot_required and before.bootstrap_state == "changes_pending"
    assert not onboarding.report(fw, state_dir, reboot_flag=flag, boot="boot-2").reboot_required
