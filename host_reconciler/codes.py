"""Stable codes of the host agent: drivers, steps, drift, discovery and its local state.

Codes are part of the product's interface: operators, CI jobs and the portal match on them.
Do not change the string values. Once set, they are set. Each constant has its one-line meaning
above it; docs/error-codes.md is generated from these lines (python -m tests.errorcodes --write).
"""

from __future__ import annotations

# a command the bench runs failed
BENCH_COMMAND_FAILED = "bench.command_failed"
# no recorded tree at … and no … to build it: pass --sysfs-root DIR (a host root) or --examples DIR (the repo...
BENCH_DISCOVER_NO_TREE = "bench.discover.no_tree"
# … is not installed
BENCH_MISSING_TOOL = "bench.missing_tool"
# the image bench needs root (a loop device)
BENCH_NEEDS_ROOT = "bench.needs_root"
# discovery cannot propose a Node document from what it found
DISCOVERY_NODE_INVALID = "discovery.node.invalid"
# the sysfs root given to discovery does not exist
DISCOVERY_ROOT_MISSING = "discovery.root.missing"
# the root given to discovery does not look like sysfs
DISCOVERY_ROOT_NOT_SYSFS = "discovery.root.not_sysfs"
# discovery: the disk has holders (a partition, a dm or md device on it)
DISK_IN_USE = "disk.in_use"
# discovery: the disk (or a partition of it) is mounted
DISK_MOUNTED = "disk.mounted"
# no disk left for this GPU (the GPU is listed, not mapped)
DISK_NONE = "disk.none"
# the disk's controller is on another NUMA node
DISK_NUMA_REMOTE = "disk.numa_remote"
# discovery: the disk holds the host's OS
DISK_OS_DISK = "disk.os_disk"
# discovery: the disk carries a filesystem, RAID, LVM or partition-table signature
DISK_SIGNATURE_PRESENT = "disk.signature_present"
# discovery: the disk's header could not be read for signatures
DISK_SIGNATURE_UNCHECKED = "disk.signature_unchecked"
# gate drift: a slot's disk identity (nvme_identity) changed
DRIFT_DISK_IDENTITY = "drift.disk_identity"
# gate drift: a slot's disk (nvme_device) is gone
DRIFT_DISK_MISSING = "drift.disk_missing"
# gate drift: a slot's disk is mounted
DRIFT_DISK_MOUNTED = "drift.disk_mounted"
# gate drift: a slot's disk holds the host's OS
DRIFT_DISK_OS = "drift.disk_os"
# gate drift: a slot's fabric parent device is gone
DRIFT_FABRIC_PARENT_MISSING = "drift.fabric_parent_missing"
# gate drift: a slot's GPU (gpu_pci_address) is gone
DRIFT_GPU_MISSING = "drift.gpu_missing"
# gate drift: a slot's NUMA node changed
DRIFT_NUMA_NODE = "drift.numa_node"
# gate drift: a slot's fabric VF is gone
DRIFT_VF_MISSING = "drift.vf_missing"
# gate drift: a slot's VF moved to another parent device
DRIFT_VF_PARENT = "drift.vf_parent"
# no free SR-IOV VF (or no fabric device at all)
FABRIC_NO_VF = "fabric.no_vf"
# the VF or device is on another NUMA node
FABRIC_NUMA_REMOTE = "fabric.numa_remote"
# a port of the parent device is not ACTIVE
FABRIC_PORT_DOWN = "fabric.port_down"
# one parent device proposed for several slots without VFs
FABRIC_SHARED_PARENT = "fabric.shared_parent"
# the VF is bound to a host driver
FABRIC_VF_NOT_VFIO = "fabric.vf_not_vfio"
# the slot map given to the discovery gate is not valid
GATE_SLOTMAP_INVALID = "gate.slotmap.invalid"
# discovery: the GPU's IOMMU group holds another endpoint
GPU_IOMMU_GROUP_SHARED = "gpu.iommu_group_shared"
# discovery: the GPU has no IOMMU group
GPU_NO_IOMMU_GROUP = "gpu.no_iommu_group"
# GPU bound to another driver (or none)
GPU_NOT_VFIO = "gpu.not_vfio"
# … acts on one slot, got …
ACTION_SLOTS = "host.action.slots"
# a command host bootstrap ran on the host root failed
BOOTSTRAP_COMMAND_FAILED = "host.bootstrap.command_failed"
# a host file bootstrap would edit was changed by someone else
BOOTSTRAP_FILE_CHANGED = "host.bootstrap.file_changed"
# the GRUB defaults already set a kernel argument to another value
BOOTSTRAP_GRUB_CONFLICT = "host.bootstrap.grub_conflict"
# the host has no /etc/default/grub to add kernel arguments to
BOOTSTRAP_GRUB_MISSING = "host.bootstrap.grub_missing"
# a host bootstrap option is out of range
BOOTSTRAP_INVALID_OPTION = "host.bootstrap.invalid_option"
# host bootstrap could not read or write a host file
BOOTSTRAP_IO_ERROR = "host.bootstrap.io_error"
# the host has no /dev/kvm (virtualization off in firmware, or no module)
BOOTSTRAP_KVM_MISSING = "host.bootstrap.kvm_missing"
# bootstrap changed kernel arguments: the host must reboot
BOOTSTRAP_REBOOT_REQUIRED = "host.bootstrap.reboot_required"
# unknown bootstrap change …
BOOTSTRAP_REFUSED = "host.bootstrap.refused"
# A system tool (iptables, sysctl, dnsmasq) exited non-zero.
COMMAND_FAILED = "host.command_failed"
# credential file … does not hold one node token (…...; made by `gpuaas host token issue NODE --out FILE`)
CREDENTIAL_INVALID = "host.credential.invalid"
# --service needs this node's token: --credential FILE or $… (`gpuaas host token issue NODE --out FILE`)
CREDENTIAL_MISSING = "host.credential.missing"
# credential file … is accessible by group or others (mode …); chmod 600 …
CREDENTIAL_PERMISSIONS = "host.credential.permissions"
# cannot read credential file …: …
CREDENTIAL_UNREADABLE = "host.credential.unreadable"
# the DHCP driver (dnsmasq) failed
DHCP_ERROR = "host.dhcp.error"
# not a dnsmasq lease time: …
DHCP_LEASE_TIME = "host.dhcp.lease_time"
# VM … has no slot bundle
DHCP_NO_BUNDLE = "host.dhcp.no_bundle"
# dnsmasq kept the lease of … on … after DHCPRELEASE
DHCP_RELEASE_FAILED = "host.dhcp.release_failed"
# the host's dnsmasq is not running
DHCP_SERVER_DOWN = "host.dhcp.server_down"
# dnsmasq for … did not write …
DHCP_START_FAILED = "host.dhcp.start_failed"
# blkid could not probe a slot disk for signatures (retried)
DISK_BLKID = "host.disk.blkid"
# The block device behind the approved by-id path is not the approved disk.
DISK_IDENTITY_CHANGED = "host.disk.identity_changed"
# The approval of this slot recorded no disk identity: nothing to compare, nothing written.
DISK_IDENTITY_MISSING = "host.disk.identity_missing"
# … is in use (…)
HOST_DISK_IN_USE = "host.disk.in_use"
# … is the disk of running domain(s) …
DISK_IN_USE_BY_DOMAIN = "host.disk.in_use_by_domain"
# … does not resolve to a device (…)
DISK_MISSING = "host.disk.missing"
# slot …: … (…) is mounted at …
HOST_DISK_MOUNTED = "host.disk.mounted"
# the host's mountinfo cannot be read (retried)
DISK_MOUNTINFO = "host.disk.mountinfo"
# slot …: … is not the approved disk of this slot (…)
DISK_NOT_APPROVED = "host.disk.not_approved"
# … -> … is not a block device
DISK_NOT_BLOCK = "host.disk.not_block"
# … is not a /dev/disk/by-id path
DISK_NOT_BY_ID = "host.disk.not_by_id"
# slot …: … (…) is the OS disk
HOST_DISK_OS_DISK = "host.disk.os_disk"
# cannot resolve the OS disk …: …; refusing to touch any disk
DISK_OS_DISK_UNKNOWN = "host.disk.os_disk_unknown"
# The guard said no; nothing was written.
DISK_REFUSED = "host.disk.refused"
# image … is … B (virtual), larger than … (… B)
DISK_TOO_SMALL = "host.disk.too_small"
# the verify pass after a wipe failed: the disk does not read back wiped
DISK_VERIFY_FAILED = "host.disk.verify_failed"
# wiping a slot's disk failed
DISK_WIPE_FAILED = "host.disk.wipe_failed"
# qemu-img convert to … failed: …
DISK_WRITE_FAILED = "host.disk.write_failed"
# The disk does not read back as the image just written to it.
DISK_WRITE_VERIFY_FAILED = "host.disk.write_verify_failed"
# hugepage size … is not 1G or 2M
DOMAIN_HUGEPAGES = "host.domain.hugepages"
# slot … disk … is not a by-id path
DOMAIN_INVALID_DISK = "host.domain.invalid_disk"
# slot … MAC … is invalid
DOMAIN_INVALID_MAC = "host.domain.invalid_mac"
# not a PCI address: …
DOMAIN_INVALID_PCI = "host.domain.invalid_pci"
# a VM spec of the plan cannot be turned into a libvirt domain
DOMAIN_INVALID_SPEC = "host.domain.invalid_spec"
# … is still running; not undefining it
DOMAIN_STILL_RUNNING = "host.domain.still_running"
# slot … disk is still attached to a domain
HEAL_LEASE_IN_USE = "host.heal.lease_in_use"
# … is not an orphan of this host
HEAL_NOT_ORPHAN = "host.heal.not_orphan"
# slot …: … … left the bus after its reset
HEALTH_DEVICE_LOST = "host.health.device_lost"
# slot …: … … is not on the PCI bus
HEALTH_DEVICE_MISSING = "host.health.device_missing"
# A slot's device did not come back healthy: the slot is blocked with this evidence.
HEALTH_FAILED = "host.health.failed"
# slot …: … … changed identity across its reset
HEALTH_IDENTITY_CHANGED = "host.health.identity_changed"
# slot …: its devices belong to domain(s) …
HEALTH_IN_USE_BY_DOMAIN = "host.health.in_use_by_domain"
# slot …: … is not a device of …'s claim; not resetting it
HEALTH_NOT_CLAIMED = "host.health.not_claimed"
# slot …: … … is on …, not …; not resetting it
HEALTH_NOT_VFIO = "host.health.not_vfio"
# …: the kernel refused the reset: …
HEALTH_RESET_FAILED = "host.health.reset_failed"
# slot … has not passed its health step for …
HEALTH_UNPROVEN = "host.health.unproven"
# hugepage size … is not 1G or 2M
HUGEPAGES_SIZE = "host.hugepages.size"
# … needs … x … pages on NUMA node …, the host has … free
HUGEPAGES_UNAVAILABLE = "host.hugepages.unavailable"
# … names a backing or data file; only self-contained qcow2 images are written
IMAGE_BACKING_FILE = "host.image.backing_file"
# --max-bytes must be positive
IMAGE_BAD_CAP = "host.image.bad_cap"
# … is not a sha256 digest (sha256:<64 lowercase hex>)
IMAGE_BAD_DIGEST = "host.image.bad_digest"
# image source_ref … is not a relative path in the image store
IMAGE_BAD_REF = "host.image.bad_ref"
# image URL … is not …
IMAGE_BAD_URL = "host.image.bad_url"
# the host's image cache failed (a file, a lock, the index)
IMAGE_CACHE = "host.image.cache"
# … is not a directory (a link?); the image cache refuses it
IMAGE_CACHE_UNSAFE = "host.image.cache_unsafe"
# verified digest … is not the claim's …
IMAGE_DIGEST_MISMATCH = "host.image.digest_mismatch"
# image sha256:… is being fetched or used by another process
IMAGE_FETCH_BUSY = "host.image.fetch_busy"
# fetching an image into the cache failed
IMAGE_FETCH_FAILED = "host.image.fetch_failed"
# image … is a file:// image and this host does not take them (allow_file_images)
IMAGE_FILE_SOURCE_OFF = "host.image.file_source_off"
# cannot write a … image
IMAGE_FORMAT = "host.image.format"
# the image URL answered an HTTP error
IMAGE_HTTP_ERROR = "host.image.http_error"
# an image of the plan is not usable (format, digest, reference)
IMAGE_INVALID = "host.image.invalid"
# image … is not in the host cache yet
IMAGE_MISSING = "host.image.missing"
# image … has no sha256 digest; an unverified image is never written
IMAGE_NO_DIGEST = "host.image.no_digest"
# image …: … is not staged under … and the host has no image_base_url
IMAGE_NO_SOURCE = "host.image.no_source"
# image … needs … bytes, … has … free after eviction (in-use and pinned images stay)
IMAGE_NO_SPACE = "host.image.no_space"
# … names no image
IMAGE_NONE = "host.image.none"
# … is not a regular file
IMAGE_NOT_REGULAR = "host.image.not_regular"
# the image source is not usable
IMAGE_SOURCE = "host.image.source"
# the image's file:// source does not exist
IMAGE_SOURCE_MISSING = "host.image.source_missing"
# the image is larger than the cache's limit
IMAGE_TOO_LARGE = "host.image.too_large"
# an ingress rule of the plan is invalid
INGRESS_INVALID = "host.ingress.invalid"
# an iptables command of the ingress driver failed
INGRESS_IPTABLES_FAILED = "host.ingress.iptables_failed"
# …: this host runs no ingress driver
INGRESS_NO_DRIVER = "host.ingress.no_driver"
# not a foreign rule of our chains: …
INGRESS_NOT_FOREIGN = "host.ingress.not_foreign"
# not a rule of our chains: …
INGRESS_NOT_OURS = "host.ingress.not_ours"
# discovery: the IOMMU is off
IOMMU_OFF = "host.iommu_off"
# the host has no KVM: no VM can run there
KVM_MISSING = "host.kvm_missing"
# slot … is still held by …
LEASE_BUSY = "host.lease.busy"
# cannot connect to …: …
LIBVIRT_CONNECT = "host.libvirt.connect"
# libvirt failed
LIBVIRT_ERROR = "host.libvirt.error"
# domain … is not defined
LIBVIRT_NO_DOMAIN = "host.libvirt.no_domain"
# libvirt refused a domain operation
LIBVIRT_REFUSED = "host.libvirt.refused"
# --metrics-listen …: cannot bind: …
METRICS_BIND_FAILED = "host.metrics.bind_failed"
# this listener does not serve that Host name (--metrics-allow-host)
METRICS_HOST_NOT_ALLOWED = "host.metrics.host_not_allowed"
# --metrics-listen …: expected HOST:PORT, for example 127.0.0.1:9101
METRICS_LISTEN_INVALID = "host.metrics.listen_invalid"
# the host's metrics server has no such path
METRICS_NOT_FOUND = "host.metrics.not_found"
# not a DNS label usable as a DHCP host name: …
NET_INVALID_HOSTNAME = "host.net.invalid_hostname"
# not a usable interface name: …
NET_INVALID_IFNAME = "host.net.invalid_ifname"
# not an IPv4 address: …
NET_INVALID_IP = "host.net.invalid_ip"
# not a MAC address: …
NET_INVALID_MAC = "host.net.invalid_mac"
# not a TCP port: …
NET_INVALID_PORT = "host.net.invalid_port"
# not an IPv4 subnet: …
NET_INVALID_SUBNET = "host.net.invalid_subnet"
# a network value of the plan is invalid
NET_INVALID_VALUE = "host.net.invalid_value"
# … is the gateway of …
NET_IP_IS_GATEWAY = "host.net.ip_is_gateway"
# … is not a host address of …
NET_IP_OUTSIDE_SUBNET = "host.net.ip_outside_subnet"
# a network namespace operation failed
NETNS_ERROR = "host.netns.error"
# not a namespace name: …
NETNS_INVALID_NAME = "host.netns.invalid_name"
# network namespace … does not exist
NETNS_MISSING = "host.netns.missing"
# entering a network namespace failed
NETNS_SETNS_FAILED = "host.netns.setns_failed"
# cannot set up bridge …: …
NETWORK_BRIDGE_FAILED = "host.network.bridge_failed"
# bridge … does not exist
NETWORK_BRIDGE_MISSING = "host.network.bridge_missing"
# the host network driver failed
NETWORK_ERROR = "host.network.error"
# setting up NAT for the management network failed
NETWORK_NAT_FAILED = "host.network.nat_failed"
# management bridge … is missing
NETWORK_NO_BRIDGE = "host.network.no_bridge"
# … exists but is a … interface, not a bridge
NETWORK_NOT_A_BRIDGE = "host.network.not_a_bridge"
# unknown datapath type …
NETWORK_OVS_DATAPATH = "host.network.ovs_datapath"
# not an OVSDB address: …
NETWORK_OVS_DB = "host.network.ovs_db"
# an Open vSwitch operation failed
NETWORK_OVS_FAILED = "host.network.ovs_failed"
# OVS could not create interface …: …
NETWORK_OVS_INTERFACE_FAILED = "host.network.ovs_interface_failed"
# … is a port of …, not …
NETWORK_PORT_ELSEWHERE = "host.network.port_elsewhere"
# cannot attach … to …: …
NETWORK_PORT_FAILED = "host.network.port_failed"
# interface … does not exist
NETWORK_PORT_MISSING = "host.network.port_missing"
# reading or setting a network sysctl failed
NETWORK_SYSCTL_FAILED = "host.network.sysctl_failed"
# discovery: the host has no /dev/kvm
NO_KVM = "host.no_kvm"
# discovery: libvirt is not installed or not running
NO_LIBVIRT = "host.no_libvirt"
# discovery: Open vSwitch is not installed or not running
NO_OVS = "host.no_ovs"
# discovery: the vfio-pci module is not loaded
NO_VFIO_PCI = "host.no_vfio_pci"
# … did not bind to … (is the vfio-pci module loaded?)
PCI_BIND_FAILED = "host.pci.bind_failed"
# a PCI driver operation failed
PCI_ERROR = "host.pci.error"
# not a PCI address: …
PCI_INVALID_ADDRESS = "host.pci.invalid_address"
# … is not on the PCI bus
PCI_MISSING = "host.pci.missing"
# … is not on … and binding is off
PCI_NOT_VFIO = "host.pci.not_vfio"
# host plan of … does not decode: …
PLAN_INVALID = "host.plan.invalid"
# … needs the plan entry of …
PLAN_MISSING_VM = "host.plan.missing_vm"
# no host plan for …
PLAN_NONE = "host.plan.none"
# cannot read plan …: …
PLAN_UNREADABLE = "host.plan.unreadable"
# the service sent a plan for …, not …
PLAN_WRONG_NODE = "host.plan.wrong_node"
# The guest does not see the devices its claim gives it (permanent: reschedule and quarantine).
READINESS_DEVICE_MISMATCH = "host.readiness.device_mismatch"
# … sent no device report from … after …s (GPU tool output and fabric port states; is nvidia-smi in the image?)
READINESS_DEVICES_TIMEOUT = "host.readiness.devices_timeout"
# the VM got no DHCP lease of its reserved IP before the readiness timeout
READINESS_LEASE_TIMEOUT = "host.readiness.lease_timeout"
# The announcement listener could not bind (the port is taken, the namespace is gone).
READINESS_MARKER_LISTEN = "host.readiness.marker_listen"
# the guest did not announce its readiness marker before the readiness timeout
READINESS_MARKER_TIMEOUT = "host.readiness.marker_timeout"
# …:… not accepting after …s (…)
READINESS_PORT_TIMEOUT = "host.readiness.port_timeout"
# The VM did not become ready in time; `stage` says which step never passed.
READINESS_TIMEOUT = "host.readiness.timeout"
# discovery: kernel arguments changed and the host must reboot
REBOOT_REQUIRED = "host.reboot_required"
# slot … was blocked for …, whose release is no longer in this host's plan
REWIPE_NO_RELEASE = "host.rewipe.no_release"
# slot … is not cleanup_blocked on …; nothing to rewipe
REWIPE_NOT_BLOCKED = "host.rewipe.not_blocked"
# the cloud-init seed of a VM cannot be built from the plan
SEED_INVALID = "host.seed.invalid"
# building a VM's seed ISO failed
SEED_ISO = "host.seed.iso"
# …: an SSH key is not an OpenSSH public key
SEED_SSH_KEY = "host.seed.ssh_key"
# …: unusable default user …
SEED_USER = "host.seed.user"
# the central service refused the host agent's request
SERVICE_REFUSED = "host.service.refused"
# the host agent cannot reach the central service
SERVICE_UNREACHABLE = "host.service.unreachable"
# no control plane: pass --service URL (or set …) with --credential; labs may use --plan-file, or --db-url
SERVICE_URL_MISSING = "host.service.url_missing"
# the host agent's settings are invalid
SETTINGS_INVALID = "host.settings.invalid"
# unknown host settings: …
SETTINGS_UNKNOWN = "host.settings.unknown"
# cannot read host settings …: …
SETTINGS_UNREADABLE = "host.settings.unreadable"
# slot … is not a slot of …
SLOT_UNKNOWN = "host.slot.unknown"
# the host agent's local state directory holds an invalid file
STATE_INVALID = "host.state.invalid"
# another host reconciler holds …/host.lock
STATE_LOCKED = "host.state.locked"
# no role created for …
STORE_ROLE = "host.store.role"
# refusing … as an ovs-vsctl argument
TOOL_ARGV = "host.tool.argv"
# … is not installed on this host
TOOL_MISSING = "host.tool.missing"
# … did not finish in …s
TOOL_TIMEOUT = "host.tool.timeout"
# the host's CPU topology cannot be read or pinned
TOPOLOGY_INVALID = "host.topology.invalid"
# NUMA node … is not on this host (cells: …)
TOPOLOGY_NUMA_NODE_MISSING = "host.topology.numa_node_missing"
# NUMA node … has … usable CPUs for … slots
TOPOLOGY_TOO_FEW_CPUS = "host.topology.too_few_cpus"
# … asks … vCPUs on NUMA node …, but its slots there give … CPUs (…)
TOPOLOGY_VCPUS_EXCEED_SHARE = "host.topology.vcpus_exceed_share"
# slot … has no verified wipe for …
WIPE_UNPROVEN = "host.wipe.unproven"
# a command the lab host runs failed
LAB_COMMAND_FAILED = "lab.command_failed"
# missing tools: … (make apt installs them)
LAB_MISSING_TOOLS = "lab.missing_tools"
# a lab host needs root (loop devices, a network namespace)
LAB_NEEDS_ROOT = "lab.needs_root"
# the lab host cannot run here (missing tools or privileges)
LAB_UNAVAILABLE = "lab.unavailable"
# a guest posted telemetry with a wrong token
TELEMETRY_BAD_TOKEN = "telemetry.bad_token"
# a guest posted telemetry too often
TELEMETRY_RATE_LIMITED = "telemetry.rate_limited"
# a guest posted telemetry for another VM
TELEMETRY_WRONG_SOURCE = "telemetry.wrong_source"
# the host agent's drivers need libvirt-python and pyroute2 (… is missing): pip install 'gpuaas-reconciler[ho...
DRIVERS_MISSING = "host.drivers_missing"
