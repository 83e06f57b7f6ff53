"""Drivers: one Protocol per outside system the host reconciler touches, one real module each.

libvirt, network (bridge, NAT, isolation), dnsmasq (DHCP reservations), disks,
PCI/VFIO and readiness. The engine depends on the Protocols only; tests drive
the real modules against namespaces, loop devices and a real dnsmasq.
"""
