"""Build the real drivers a host's settings ask for (the one place that picks them).

psycopg picks its libpq implementation in one function; so does this module
for the host drivers: libvirt, block disks, PCI (sysfs, or the fake on a
host without GPUs), dnsmasq, the readiness gate and the bridge (Linux or OVS).
"""

from __future__ import annotations

from host_reconciler.context import Drivers
from host_reconciler.drivers import fakes
from host_reconciler.drivers.disks import BlockDisks
from host_reconciler.drivers.dnsmasq import DnsmasqDhcp, DnsmasqServer
from host_reconciler.drivers.guestmarker import Announcements
from host_reconciler.drivers.ingress import IptablesIngress
from host_reconciler.drivers.libvirt_driver import LibvirtDomains
from host_reconciler.drivers.network import LinuxBridgeNetwork
from host_reconciler.drivers.ovs import OvsNetwork
from host_reconciler.drivers.pci import SysfsPci
from host_reconciler.drivers.protocols import NetworkDriver, PciDriver, ReadinessDriver
from host_reconciler.drivers.readiness import LeaseReadiness
from host_reconciler.drivers.seediso import pack_iso
from host_reconciler.settings import HostSettings


def drivers(settings: HostSettings) -> Drivers:
    server = DnsmasqServer(settings.dnsmasq_dir, netns_name=settings.netns)
    pci: PciDriver
    if settings.pci == "fake-vfio":
        pci = fakes.FakePci(all_present=True, allow_bind=settings.vfio_bind)
    else:
        pci = SysfsPci(settings.sysfs_root, allow_bind=settings.vfio_bind)
    readiness: ReadinessDriver | None = None
    if settings.readiness == "lease-tcp":
        marker = Announcements(
            settings.state_dir / "guest-marker.key", port=settings.guest_marker_port, netns_name=settings.netns
        )
        readiness = LeaseReadiness(server.lease_file, netns_name=settings.netns, announcements=marker)
    network: NetworkDriver
    if settings.bridge_kind == "ovs":
        network = OvsNetwork(settings.netns, db=settings.ovs_db, datapath_type=settings.ovs_datapath)
    else:
        network = LinuxBridgeNetwork(settings.netns)
    return Drivers(
        domains=LibvirtDomains(settings.libvirt_uri),
        disks=BlockDisks(settings.disk_settings()),
        pci=pci,
        dhcp=DnsmasqDhcp(server),
        pack_seed=pack_iso,
        readiness=readiness,
        network=network,
        # Public endpoints ride the same switch as the bridge and its NAT: a host whose network is
        # managed elsewhere has its ingress managed there too.
        ingress=IptablesIngress(settings.netns) if settings.manage_network else None,
    )
