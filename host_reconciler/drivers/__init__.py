"""Drivers: one Protocol per outside system the host reconciler touches, one real module each.

libvirt, network (bridge, NAT, isolation), dnsmasq (DHCP reservations), disks,
PCI/VFIO and readiness. The Protocols and the values they pass are in
`protocols.py`; the engine imports only that module (an import-linter contract); tests drive
the real modules against namespaces, loop devices and a real dnsmasq.
"""
