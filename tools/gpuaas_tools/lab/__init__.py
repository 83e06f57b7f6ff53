"""Stand-ins the demo, the benches and the tests run against on one machine.

`host.py` a lab host (loop devices, a network namespace, the libvirt test
driver, optionally a recorded sysfs tree); `ironic_service.py` a standalone
Ironic process; `maas_sim.py` the MAAS simulator; `sshstandin.py` the
listener that answers for a deployed machine's SSH.
"""
