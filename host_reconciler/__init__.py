"""The per-host reconciler: converge libvirt, network, dnsmasq and NVMe disks to the host plan.

`diff(host_plan, observed) -> actions` is pure; drivers (one Protocol per
outside system) observe and act. Discovery and the approval gate live in
`host_reconciler.discovery`.
"""
