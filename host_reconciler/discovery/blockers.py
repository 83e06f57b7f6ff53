"""Stable codes of the blockers a candidate slot can carry.

A blocker says why a discovered slot must not be approved as it stands; the
eligibility policy refuses any slot that still lists one. Operators, the
portal and CI grep for these codes: do not change the string values. Once
set, they are set.
"""

from __future__ import annotations

from host_reconciler import codes as host_codes
from host_reconciler.discovery import hosts

GPU_NOT_VFIO = host_codes.GPU_NOT_VFIO
GPU_NO_IOMMU_GROUP = host_codes.GPU_NO_IOMMU_GROUP
GPU_IOMMU_GROUP_SHARED = host_codes.GPU_IOMMU_GROUP_SHARED

FABRIC_NO_VF = host_codes.FABRIC_NO_VF
FABRIC_SHARED_PARENT = host_codes.FABRIC_SHARED_PARENT
FABRIC_NUMA_REMOTE = host_codes.FABRIC_NUMA_REMOTE
FABRIC_PORT_DOWN = host_codes.FABRIC_PORT_DOWN
FABRIC_VF_NOT_VFIO = host_codes.FABRIC_VF_NOT_VFIO

DISK_OS = host_codes.DISK_OS_DISK
DISK_MOUNTED = host_codes.DISK_MOUNTED
DISK_IN_USE = host_codes.DISK_IN_USE
DISK_SIGNATURE = host_codes.DISK_SIGNATURE_PRESENT
DISK_SIGNATURE_UNCHECKED = host_codes.DISK_SIGNATURE_UNCHECKED
DISK_NUMA_REMOTE = host_codes.DISK_NUMA_REMOTE
DISK_NONE = host_codes.DISK_NONE

# A failed host prerequisite blocks every slot of the host.
HOST = {
    hosts.IOMMU: host_codes.IOMMU_OFF,
    hosts.KVM: host_codes.NO_KVM,
    hosts.VFIO_PCI: host_codes.NO_VFIO_PCI,
    hosts.LIBVIRT: host_codes.NO_LIBVIRT,
    hosts.OVS: host_codes.NO_OVS,
    hosts.REBOOT: host_codes.REBOOT_REQUIRED,
}
