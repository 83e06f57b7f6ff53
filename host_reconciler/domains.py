"""Libvirt domain XML for a slice VM, built from its slot bundles, and read back.

What a slice VM looks like (seeds 000 and 002, prototype `virt-install` line):

- UEFI with Secure Boot off (guest NVIDIA driver, no MOK prompts), no TPM,
  no graphics, a serial console;
- host-passthrough CPU, vCPUs pinned 1:1 to NUMA-local CPUs derived from the
  host topology (`pinning.place_vcpus`), memory bound to those NUMA nodes,
  optionally backed by 1 GiB hugepages;
- one `<hostdev>` per GPU and per fabric VF, `managed='no'`: devices stay on
  vfio-pci across VM lifetimes (seed 000), libvirt must not rebind them;
- each slot's approved by-id disk as a raw block device on virtio-scsi, the
  boot slot's first;
- one virtio NIC on the management bridge with the boot slot's MAC;
- a stable name and UUID from the allocation id, and our metadata (the
  allocation, its slots and a digest of the spec) so drift and orphans are
  recognised without guessing from names.

`build` and `read` are pure; the libvirt driver defines what `build` returns
and hands `read` what libvirt returns, so libvirt itself checks every XML.
"""

from __future__ import annotations

import hashlib
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from desired.patterns import BY_ID_RE, MAC_RE, PCI_RE
from host_reconciler import codes as host_codes
from host_reconciler import pinning
from schemas.errors import PermanentError
from schemas.hostplans import Network, VmSpec

NS = "https://gpuaas.io/xmlns/host-reconciler/1"
PREFIX = "gpuaas-"  # every domain this reconciler owns is named gpuaas-<allocation>
_PCI = re.compile(PCI_RE)
_BY_ID = re.compile(BY_ID_RE)
_MAC = re.compile(MAC_RE)
_ALLOC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")

ET.register_namespace("gpuaas", NS)


class DomainSpecError(PermanentError):
    code = host_codes.DOMAIN_INVALID_SPEC


@dataclass(frozen=True, slots=True)
class DirectKernel:
    """Lab only: boot a kernel and initramfs directly (TCG end-to-end test)."""

    kernel: str
    initrd: str
    cmdline: str = "console=ttyS0"


@dataclass(frozen=True, slots=True)
class DomainOptions:
    """Host settings that shape the XML (not part of the allocation)."""

    domain_type: str = "kvm"  # "qemu" under TCG, "test" for libvirt's test driver
    firmware: Literal["efi", "bios"] = "efi"
    bridge_kind: Literal["linux", "ovs"] = "linux"
    machine: str = "q35"
    seed_iso: str | None = None  # cloud-init NoCloud seed, attached read-only
    direct_kernel: DirectKernel | None = None
    reserved_cpus_per_cell: int = 0


@dataclass(frozen=True, slots=True)
class DomainFacts:
    """What drift compares: the parts of a domain that must match its bundles."""

    name: str
    uuid: str
    allocation_id: str | None = None
    slot_indexes: tuple[int, ...] = ()
    spec_digest: str | None = None
    hostdevs: tuple[str, ...] = ()  # PCI addresses, sorted
    disks: tuple[str, ...] = ()  # block device sources, in XML order
    macs: tuple[str, ...] = ()
    bridges: tuple[str, ...] = ()
    vcpus: int = 0
    memory_mib: int = 0
    cpuset: tuple[int, ...] = ()
    graphics: bool = False
    tpm: bool = False
    secure_boot: bool | None = None
    hugepages: bool = False
    extra: dict[str, str] = field(default_factory=dict)


def default_domain_type(uri: str) -> str:
    """`test` for libvirt's test driver, else `kvm` (TCG setups set `qemu` explicitly)."""
    return "test" if uri.split(":", 1)[0].split("+", 1)[0] == "test" else "kvm"


def spec_digest(vm: VmSpec, network: Network, options: DomainOptions) -> str:
    """A digest of what shapes the domain (devices, CPU, memory, bridge, host options).

    Stored in the domain's metadata. The image, SSH keys and claim ids shape the
    disk and the seed, not the domain, and fields added to VmSpec later change
    nothing here unless listed: a running VM is never seen as changed by a
    new plan field.
    """
    shaping = replace(options, seed_iso=None)  # the seed path is derived, not chosen
    doc = {
        "allocation_id": vm.allocation_id,
        "tenant": vm.tenant,
        "bundles": [asdict(b) for b in vm.bundles],
        "vcpu_count": vm.vcpu_count,
        "memory_mib": vm.memory_mib,
        "hugepages": vm.hugepages,
        "hugepage_size": vm.hugepage_size,
        "bridge": network.bridge,
        "options": asdict(shaping),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:32]


def seed_digest(vm: VmSpec) -> str:
    """A digest of what shapes the cloud-init seed (name, identity, user, keys, NIC)."""
    boot = vm.bundles[boot_bundle(vm)] if vm.bundles else None
    doc = {
        "name": vm.name,
        "uuid": vm.uuid,
        "keys": list(vm.ssh_keys),
        "user": vm.image.default_username if vm.image else "ubuntu",
        "mac": boot.mac_address.lower() if boot else None,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def pci(address: str) -> tuple[str, str, str, str]:
    if not _PCI.match(address):
        raise DomainSpecError(f"not a PCI address: {address!r}", code=host_codes.DOMAIN_INVALID_PCI)
    domain, bus, device_function = address.split(":")
    device, function = device_function.split(".")
    return domain, bus, device, function


def _check(vm: VmSpec) -> None:
    if not _ALLOC.match(vm.allocation_id):
        raise DomainSpecError(f"unusable allocation id {vm.allocation_id!r}")
    if not vm.bundles:
        raise DomainSpecError(f"{vm.allocation_id} has no slot bundles")
    for b in vm.bundles:
        pci(b.gpu_pci_address)
        if b.fabric_vf_pci_address:
            pci(b.fabric_vf_pci_address)
        if not _BY_ID.match(b.nvme_device):
            raise DomainSpecError(
                f"slot {b.slot_index} disk {b.nvme_device!r} is not a by-id path",
                code=host_codes.DOMAIN_INVALID_DISK,
            )
        if not _MAC.match(b.mac_address):
            raise DomainSpecError(
                f"slot {b.slot_index} MAC {b.mac_address!r} is invalid",
                code=host_codes.DOMAIN_INVALID_MAC,
            )
    if vm.vcpu_count < 1 or vm.memory_mib < 256:
        raise DomainSpecError(f"{vm.allocation_id}: {vm.vcpu_count} vCPUs / {vm.memory_mib} MiB")
    if vm.hugepages:
        size = vm.hugepage_size or "1G"
        if size not in pinning.HUGEPAGE_KIB:
            raise DomainSpecError(f"hugepage size {size!r} is not 1G or 2M", code=host_codes.DOMAIN_HUGEPAGES)


def boot_bundle(vm: VmSpec) -> int:
    """Index into vm.bundles of the boot slot: the first (its MAC, IP and disk boot the VM)."""
    return 0


def build(
    vm: VmSpec,
    *,
    network: Network,
    placement: pinning.CpuPlacement,
    options: DomainOptions,
    digest: str,
) -> str:
    _check(vm)
    dom = ET.Element("domain", type=options.domain_type)
    ET.SubElement(dom, "name").text = vm.name
    ET.SubElement(dom, "uuid").text = vm.uuid
    meta = ET.SubElement(ET.SubElement(dom, "metadata"), f"{{{NS}}}vm")
    ET.SubElement(meta, f"{{{NS}}}allocation").text = vm.allocation_id
    ET.SubElement(meta, f"{{{NS}}}tenant").text = vm.tenant
    ET.SubElement(meta, f"{{{NS}}}slots").text = ",".join(str(b.slot_index) for b in vm.bundles)
    ET.SubElement(meta, f"{{{NS}}}spec-digest").text = digest
    _memory(dom, vm, placement)
    _cpus(dom, vm, placement)
    _firmware(dom, options)
    _guest_numa(dom, placement)
    ET.SubElement(dom, "clock", offset="utc")
    for event, what in (
        ("on_poweroff", "destroy"),
        ("on_reboot", "restart"),
        ("on_crash", "destroy"),
    ):
        ET.SubElement(dom, event).text = what
    _devices(ET.SubElement(dom, "devices"), vm, network, options)
    ET.indent(dom)
    return ET.tostring(dom, encoding="unicode")


def _memory(dom: ET.Element, vm: VmSpec, placement: pinning.CpuPlacement) -> None:
    ET.SubElement(dom, "memory", unit="MiB").text = str(vm.memory_mib)
    ET.SubElement(dom, "currentMemory", unit="MiB").text = str(vm.memory_mib)
    if not vm.hugepages:
        return
    size_kib = pinning.HUGEPAGE_KIB[vm.hugepage_size or "1G"]
    whole = pinning.GuestCell(placement.nodeset[0], (), vm.memory_mib)
    for cell in placement.guest_cells or (whole,):
        if cell.memory_mib * 1024 % size_kib:
            raise DomainSpecError(
                f"{cell.memory_mib} MiB on NUMA node {cell.host_node} is not a whole number of "
                f"{vm.hugepage_size or '1G'} pages",
                code=host_codes.DOMAIN_HUGEPAGES,
            )
    backing = ET.SubElement(dom, "memoryBacking")
    ET.SubElement(ET.SubElement(backing, "hugepages"), "page", size=str(size_kib), unit="KiB")


def _cpus(dom: ET.Element, vm: VmSpec, placement: pinning.CpuPlacement) -> None:
    vcpu = ET.SubElement(dom, "vcpu", placement="static", cpuset=placement.cpuset)
    vcpu.text = str(vm.vcpu_count)
    tune = ET.SubElement(dom, "cputune")
    for v, cpu in enumerate(placement.pins):
        ET.SubElement(tune, "vcpupin", vcpu=str(v), cpuset=str(cpu))
    ET.SubElement(tune, "emulatorpin", cpuset=placement.cpuset)
    numatune = ET.SubElement(dom, "numatune")
    nodeset = pinning.format_cpuset(placement.nodeset)
    ET.SubElement(numatune, "memory", mode="strict", nodeset=nodeset)
    for i, cell in enumerate(placement.guest_cells):
        node = str(cell.host_node)
        ET.SubElement(numatune, "memnode", cellid=str(i), mode="strict", nodeset=node)


def _firmware(dom: ET.Element, options: DomainOptions) -> None:
    efi = options.firmware == "efi"
    os_ = ET.SubElement(dom, "os", firmware="efi") if efi else ET.SubElement(dom, "os")
    ET.SubElement(os_, "type", arch="x86_64", machine=options.machine).text = "hvm"
    if efi:
        fw = ET.SubElement(os_, "firmware")
        ET.SubElement(fw, "feature", enabled="no", name="secure-boot")
        ET.SubElement(fw, "feature", enabled="no", name="enrolled-keys")
    if options.direct_kernel:
        ET.SubElement(os_, "kernel").text = options.direct_kernel.kernel
        ET.SubElement(os_, "initrd").text = options.direct_kernel.initrd
        ET.SubElement(os_, "cmdline").text = options.direct_kernel.cmdline
    feats = ET.SubElement(dom, "features")
    ET.SubElement(feats, "acpi")
    ET.SubElement(feats, "apic")


def _guest_numa(dom: ET.Element, placement: pinning.CpuPlacement) -> None:
    cpu = ET.SubElement(dom, "cpu", mode="host-passthrough", check="none", migratable="off")
    if not placement.guest_cells:
        return
    numa = ET.SubElement(cpu, "numa")
    for i, cell in enumerate(placement.guest_cells):
        cpus = pinning.format_cpuset(cell.vcpus)
        ET.SubElement(numa, "cell", id=str(i), cpus=cpus, memory=str(cell.memory_mib), unit="MiB")


def _devices(dev: ET.Element, vm: VmSpec, network: Network, options: DomainOptions) -> None:
    bundles = list(vm.bundles)
    boot = bundles[boot_bundle(vm)]
    ET.SubElement(dev, "controller", type="scsi", index="0", model="virtio-scsi")
    for i, b in enumerate(bundles):
        disk = ET.SubElement(dev, "disk", type="block", device="disk")
        ET.SubElement(disk, "driver", name="qemu", type="raw", cache="none", io="native", discard="unmap")
        ET.SubElement(disk, "source", dev=b.nvme_device)
        ET.SubElement(disk, "target", dev=_scsi_name(i), bus="scsi")
        if i == 0 and not options.direct_kernel:
            ET.SubElement(disk, "boot", order="1")
    if options.seed_iso:
        cd = ET.SubElement(dev, "disk", type="file", device="cdrom")
        ET.SubElement(cd, "driver", name="qemu", type="raw")
        ET.SubElement(cd, "source", file=options.seed_iso)
        ET.SubElement(cd, "target", dev=_scsi_name(len(bundles)), bus="scsi")
        ET.SubElement(cd, "readonly")
    nic = ET.SubElement(dev, "interface", type="bridge")
    ET.SubElement(nic, "mac", address=boot.mac_address.lower())
    ET.SubElement(nic, "source", bridge=network.bridge)
    if options.bridge_kind == "ovs":
        ET.SubElement(nic, "virtualport", type="openvswitch")
    ET.SubElement(nic, "model", type="virtio")
    for b in bundles:
        for address in filter(None, (b.gpu_pci_address, b.fabric_vf_pci_address)):
            d, bus, slot, fn = pci(address)
            hd = ET.SubElement(dev, "hostdev", mode="subsystem", type="pci", managed="no")
            ET.SubElement(
                ET.SubElement(hd, "source"),
                "address",
                domain=f"0x{d}",
                bus=f"0x{bus}",
                slot=f"0x{slot}",
                function=f"0x{fn}",
            )
    serial = ET.SubElement(dev, "serial", type="pty")
    ET.SubElement(serial, "target", port="0")
    console = ET.SubElement(dev, "console", type="pty")
    ET.SubElement(console, "target", type="serial", port="0")
    ET.SubElement(ET.SubElement(dev, "video"), "model", type="none")
    ET.SubElement(dev, "memballoon", model="none")


def _scsi_name(i: int) -> str:
    return "sd" + "abcdefghijklmnopqrstuvwxyz"[i]


def read(xml: str) -> DomainFacts:
    """Facts from a domain's XML as libvirt returns it (pure)."""
    root = ET.fromstring(xml)  # noqa: S314 -- libvirt's own output
    name = root.findtext("name", "")
    meta = root.find(f"./metadata/{{{NS}}}vm")
    alloc = slots = digest = None
    if meta is not None:
        alloc = meta.findtext(f"{{{NS}}}allocation")
        slots = meta.findtext(f"{{{NS}}}slots")
        digest = meta.findtext(f"{{{NS}}}spec-digest")
    hostdevs: list[str] = []
    for a in root.findall("./devices/hostdev[@type='pci']/source/address"):
        hostdevs.append(
            "{:04x}:{:02x}:{:02x}.{:x}".format(*(int(a.get(k, "0"), 0) for k in ("domain", "bus", "slot", "function")))
        )
    disks = tuple(s.get("dev", "") for s in root.findall("./devices/disk[@type='block']/source"))
    macs = tuple(m.get("address", "").lower() for m in root.findall("./devices/interface/mac"))
    bridges = tuple(s.get("bridge", "") for s in root.findall("./devices/interface/source"))
    vcpu = root.find("vcpu")
    mem = root.find("memory")
    mem_kib = _kib(int(mem.text or 0), mem.get("unit", "KiB")) if mem is not None else 0
    pins = [int(p.get("cpuset", "-1")) for p in root.findall("./cputune/vcpupin") if p.get("cpuset", "").isdigit()]
    sb = root.find("./os/firmware/feature[@name='secure-boot']")
    loader = root.find("./os/loader")
    secure: bool | None = None
    if sb is not None:
        secure = sb.get("enabled") == "yes"
    elif loader is not None and loader.get("secure"):
        secure = loader.get("secure") == "yes"
    return DomainFacts(
        name=name,
        uuid=root.findtext("uuid", ""),
        allocation_id=alloc,
        slot_indexes=tuple(int(s) for s in slots.split(",") if s.strip().isdigit()) if slots else (),
        spec_digest=digest,
        hostdevs=tuple(sorted(hostdevs)),
        disks=disks,
        macs=macs,
        bridges=bridges,
        vcpus=int(vcpu.text or 0) if vcpu is not None else 0,
        memory_mib=mem_kib // 1024,
        cpuset=tuple(pins),
        graphics=root.find("./devices/graphics") is not None,
        tpm=root.find("./devices/tpm") is not None,
        secure_boot=secure,
        hugepages=root.find("./memoryBacking/hugepages") is not None,
    )


def _kib(value: int, unit: str) -> int:
    scale = {
        "b": 1 / 1024,
        "bytes": 1 / 1024,
        "KiB": 1,
        "k": 1,
        "MiB": 1024,
        "M": 1024,
        "GiB": 1024**2,
        "G": 1024**2,
    }
    return int(value * scale.get(unit, 1))


def expected_facts(vm: VmSpec, network: Network) -> DomainFacts:
    """The device facts a correct domain of `vm` shows (for drift)."""
    bundles = list(vm.bundles)
    return DomainFacts(
        name=vm.name,
        uuid=vm.uuid,
        allocation_id=vm.allocation_id,
        slot_indexes=tuple(b.slot_index for b in bundles),
        hostdevs=tuple(sorted(a for b in bundles for a in (b.gpu_pci_address, b.fabric_vf_pci_address) if a)),
        disks=tuple(b.nvme_device for b in bundles),
        macs=(bundles[0].mac_address.lower(),),
        bridges=(network.bridge,),
        vcpus=vm.vcpu_count,
        memory_mib=vm.memory_mib,
    )
