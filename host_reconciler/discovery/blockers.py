"""Stable codes of the blockers a candidate slot can carry.

A blocker says why a discovered slot must not be approved as it stands; the
eligibility policy refuses any slot that still lists one. Operators, the
portal and CI grep for these codes: do not change the string values. Once
set, they are set.
"""

from __future__ import annotations

from host_reconciler.discovery import hosts

GPU_NOT_VFIO = "gpu.not_vfio"
GPU_NO_IOMMU_GROUP = "gpu.no_iommu_group"
GPU_IOMMU_GROUP_SHARED = "gpu.iommu_group_shared"

FABRIC_NO_VF = "fabric.no_vf"
FABRIC_SHARED_PARENT = "fabric.shared_parent"
FABRIC_NUMA_REMOTE = "fabric.numa_remote"
FABRIC_PORT_DOWN = "fabric.port_down"
FABRIC_VF_NOT_VFIO = "fabric.vf_not_vfio"

DISK_OS = "disk.os_disk"
DISK_MOUNTED = "disk.mounted"
DISK_IN_USE = "disk.in_use"
DISK_SIGNATURE = "disk.signature_present"
DISK_SIGNATURE_UNCHECKED = "disk.signature_unchecked"
DISK_NUMA_REMOTE = "disk.numa_remote"
DISK_NONE = "disk.none"

# A failed host prerequisite blocks every slot of the host.
HOST = {
    hosts.IOMMU: "host.iommu_off",
    hosts.KVM: "host.no_kvm",
    hosts.VFIO_PCI: "host.no_vfio_pci",
    hosts.LIBVIRT: "host.no_libvirt",
    hosts.OVS: "host.no_ovs",
    hosts.REBOOT: "host.reboot_required",
}
